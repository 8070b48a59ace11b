"""The reward-model source: what a step's rm section sends to the server, and in which text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError
from transformers import AutoTokenizer

from model_fixtures import save_reward_model, serving
from rlsteps.contract.reward_config import RewardModelClientConfig
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.rewards.rm.client import RewardClient
from rlsteps.engine.rewards.rm.scorer import RewardScorer
from rlsteps.engine.rewards.rm.server import create_app
from rlsteps.engine.rewards.sources import (
    JUDGE_SERVER,
    RM_CLIENT_OPTIONS,
    RM_SERVER,
    RewardModelSource,
    _served,
    local_rm_server_args,
)
from test_reward_server import TEMPLATE

STEPS = Path(__file__).resolve().parents[1] / "steps"
CONVERSATIONS = [
    [{"role": "user", "content": "the cat"}],
    [{"role": "system", "content": "count:"}, {"role": "user", "content": "1 2"}],
]
RESPONSES = [" sat on the mat.", " 3 4"]


def test_the_step_yaml_and_the_schema_agree_on_the_rm_defaults() -> None:
    section = yaml.safe_load((STEPS / "rl" / "reward_model.yaml").read_text())["rm"]
    assert RewardModelClientConfig(**section) == RewardModelClientConfig()
    assert {"max_length", "truncation_side", "chat_template"} <= section.keys()
    with pytest.raises(ValidationError, match="chat_template"):
        RewardModelClientConfig(chat_template="judge")
    with pytest.raises(ValidationError, match="truncation_side"):
        RewardModelClientConfig(truncation_side="middle")


def test_a_server_of_another_kind_needs_its_url_and_triton_reads_the_policys_tokens() -> None:
    with pytest.raises(ValidationError, match="rm.api=vllm scores through a server you run.*set rm.url"):
        RewardModelClientConfig(api="vllm")
    with pytest.raises(ValidationError, match="rm.api=triton sends the policy's token ids"):
        RewardModelClientConfig(api="triton", url="http://rm:5555", chat_template="reward_model")
    with pytest.raises(ValidationError, match="api"):
        RewardModelClientConfig(api="openai", url="http://rm:5555")
    assert RewardModelClientConfig(api="vllm", url="http://rm:8000", chat_template="reward_model").api == "vllm"


def test_the_rm_section_sets_the_truncation_of_every_request_and_of_a_local_server() -> None:
    rm = RewardModelClientConfig(max_length=128, truncation_side="right", batch_size=32, concurrency=8)
    with RewardClient("http://127.0.0.1:1", **rm.model_dump(include=RM_CLIENT_OPTIONS)) as client:
        assert client.api.options == {"max_length": 128, "truncation_side": "right"}
    assert local_rm_server_args(rm) == [
        "--device", "auto", "--dtype", "auto", "--max-batch", "64", "--max-wait-ms", "5", "--max-queue", "256",
        "--truncation-side", "right", "--max-length", "128",
    ]  # fmt: skip
    default = RewardModelClientConfig()
    with RewardClient("http://127.0.0.1:1", **default.model_dump(include=RM_CLIENT_OPTIONS)) as client:
        assert client.api.options == {"truncation_side": "left"}  # max_length: the server's own
    assert "--max-length" not in local_rm_server_args(default)


def test_the_step_config_says_where_and_in_what_dtype_a_local_reward_server_runs(tmp_path) -> None:
    from rlsteps.contract.reward_config import RewardServerConfig

    rm = RewardModelClientConfig(server=RewardServerConfig(device="cpu", dtype="bfloat16"))
    args = local_rm_server_args(rm)
    assert args[args.index("--device") + 1] == "cpu" and args[args.index("--dtype") + 1] == "bfloat16"
    scorer = RewardScorer(save_reward_model(tmp_path / "rm"), device="cpu", dtype="bfloat16")
    assert scorer.model.dtype == torch.bfloat16
    assert RewardScorer(save_reward_model(tmp_path / "rm"), device="cpu").model.dtype == torch.float32  # as stored
    with pytest.raises(ValidationError, match="dtype"):
        RewardServerConfig(dtype="float64")


@pytest.mark.slow  # two servers, each a process that imports torch
@pytest.mark.parametrize("module", [RM_SERVER, JUDGE_SERVER])
def test_a_server_the_run_starts_computes_on_the_runs_threads(module, tmp_path) -> None:
    """run.num_threads reaches the reward or judge server a run starts for itself, as it does the worker: left at
    torch's default, the server takes every core, and runs side by side spin their servers against each other."""
    threads = (os.cpu_count() or 1) + 1  # never torch's own default, which is at most the cores
    log_path = tmp_path / "server.log"
    with _served(module, None, str(save_reward_model(tmp_path / "rm")), log_path, [], None, threads) as (_, ready):
        ready()
    assert f"(torch.float32, {threads} CPU threads)" in log_path.read_text()


def batch_of(conversations: list[list[dict]], prompt_texts: list[str], responses: list[str]) -> RolloutBatch:
    n = len(responses)
    return RolloutBatch(
        tokens=torch.ones(n, 4, dtype=torch.long), prompt_lengths=torch.full((n,), 2),
        response_lengths=torch.full((n,), 2), is_end=torch.ones(n, dtype=torch.bool),
        prompt_ids=[f"p{i}" for i in range(n)], prompt_texts=prompt_texts, response_texts=responses, pad_id=0,
        conversations=conversations,
    )  # fmt: skip


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list, list]] = []

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        self.calls.append(("score", list(prompts), list(responses)))
        return [1.0] * len(prompts)

    def score_conversations(self, conversations: list, responses: list[str]) -> list[float]:
        self.calls.append(("score_conversations", list(conversations), list(responses)))
        return [2.0] * len(conversations)


def test_chat_template_picks_what_the_source_sends() -> None:
    batch = batch_of(CONVERSATIONS, ["rendered 0", "rendered 1"], RESPONSES)
    policy, own = Recording(), Recording()
    assert RewardModelSource(policy).score(batch).rewards.tolist() == [1.0, 1.0]
    assert RewardModelSource(own, chat_template="reward_model").score(batch).rewards.tolist() == [2.0, 2.0]
    assert policy.calls == [("score", ["rendered 0", "rendered 1"], RESPONSES)]
    assert own.calls == [("score_conversations", CONVERSATIONS, RESPONSES)]
    raw = batch_of(None, ["a raw prompt", "another"], RESPONSES)  # prompts given as text: one user message each
    RewardModelSource(own, chat_template="reward_model").score(raw)
    assert own.calls[-1][1] == [[{"role": "user", "content": "a raw prompt"}], [{"role": "user", "content": "another"}]]
    with pytest.raises(ValueError, match="policy or reward_model"):
        RewardModelSource(own, chat_template="judge")


def test_reward_model_template_scores_as_the_policy_text_when_the_templates_agree(tmp_path: Path) -> None:
    path = save_reward_model(tmp_path / "rm")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    scorer = RewardScorer(path, max_length=64, batch_size=4)
    rendered = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in CONVERSATIONS]
    batch = batch_of(CONVERSATIONS, rendered, RESPONSES)
    with serving(create_app(scorer)) as url, RewardClient(url) as client:
        own = RewardModelSource(client, chat_template="reward_model").score(batch).rewards
        policy = RewardModelSource(client, chat_template="policy").score(batch).rewards
    assert torch.allclose(own, policy, atol=1e-5)
    assert torch.allclose(own, torch.tensor(scorer.score(rendered, RESPONSES)), atol=1e-5)
