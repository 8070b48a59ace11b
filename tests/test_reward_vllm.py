"""rm.api=vllm against the real vLLM (its CPU build, .venv-vllm) serving the tiny world's reward model, a Hugging Face
one-label sequence-classification model, started as docs/rewards.md tells users to.

The rewards rlsteps gets through vLLM's /classify are its own server's on the same pairs (`rlsteps serve rm` on the
same model), within REWARD_TOLERANCE: raw scores, where vLLM by default passes a one-label model's score through a
sigmoid; both as texts (the prompt as the policy saw it, the response and the reward tokenizer's EOS, which vLLM
names at /tokenizer_info) and as conversations (rendered by vLLM with the model's chat template); cut to
rm.max_length on the same side. A tiny run then trains on vLLM's rewards.
"""

from __future__ import annotations

import math
import random

import pytest
from transformers import AutoTokenizer

from reward_servers import VLLM_REWARD_NAME, vllm_reward_server
from rlsteps.engine.rewards.process import LocalServer
from rlsteps.engine.rewards.rm.client import RewardClient, RewardServerError
from rlsteps.tiny.task import sample_prompt, sample_response
from run_helpers import FAST, rlsteps, run_dir, series

pytestmark = pytest.mark.slow

REWARD_TOLERANCE = 1e-4  # absolute, on rewards of -17.5 to 18.2; measured at most 1.2e-5 (vLLM's kernels, fp32)


@pytest.fixture(scope="module")
def servers(tiny_world, tmp_path_factory):
    """(vLLM's URL, rlsteps's own server's URL), both serving the tiny reward model."""
    logs = tmp_path_factory.mktemp("reward-servers")
    own = LocalServer("rlsteps.engine.rewards.rm", ["--model", str(tiny_world.reward_model)], log_path=logs / "rm.log")
    with vllm_reward_server(tiny_world.reward_model, logs / "vllm.log") as vllm_url, own:
        yield vllm_url, own.url


def pairs(tiny_world, count: int = 24) -> tuple[list[list[dict]], list[str], list[str]]:
    """(conversations, prompts as the policy sees them, responses): the task's prompts with responses of the SFT
    distribution, half of them more positive, and one response long enough to be cut."""
    rng = random.Random(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_world.policy)
    conversations, responses = [], []
    for i in range(count):
        prompt, noun = sample_prompt(rng)
        conversations.append([{"role": "user", "content": prompt}])
        responses.append(sample_response(rng, noun, p_positive=0.25 if i % 2 else 0.75))
    responses[-1] = " ".join([responses[-1]] * 12)
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
    return conversations, prompts, responses


def assert_close(got: list[float], expected: list[float]) -> None:
    assert len(got) == len(expected)
    worst = max(abs(a - b) for a, b in zip(got, expected))
    assert worst <= REWARD_TOLERANCE, (worst, got, expected)
    assert max(map(abs, expected)) > 1.5  # raw scores: a sigmoid's would all lie within (0, 1)


def test_vllms_rewards_are_rlsteps_own_servers_on_the_same_pairs(servers, tiny_world):
    vllm_url, own_url = servers
    conversations, prompts, responses = pairs(tiny_world)
    last_pair = {}  # the long pair's reward, whole and cut on either side
    for options in ({}, {"max_length": 40, "truncation_side": "left"}, {"max_length": 40, "truncation_side": "right"}):
        with (
            RewardClient(vllm_url, api="vllm", model=VLLM_REWARD_NAME, batch_size=5, **options) as vllm,
            RewardClient(own_url, **options) as own,
        ):
            expected = own.score(prompts, responses)
            assert_close(vllm.score(prompts, responses), expected)
            assert_close(
                vllm.score_conversations(conversations, responses), own.score_conversations(conversations, responses)
            )
            last_pair[options.get("truncation_side")] = expected[-1]
    assert len(set(last_pair.values())) == 3  # the cut mattered, and its side


def test_a_model_name_vllm_does_not_serve_is_refused_at_once_with_the_fix(servers):
    vllm_url, _ = servers
    with RewardClient(vllm_url, api="vllm", model="another-model", backoff_s=30) as client:
        with pytest.raises(RewardServerError, match="HTTP 404.*does not exist.*--runner pooling"):
            client.score(["a"], ["b"])  # no retry: a 30 s backoff would show


def test_a_tiny_run_scores_through_vllm_as_through_rlsteps_own_server(servers, tmp_path):
    """The same run (same seed, so the same rollouts and greedy validation) against each server: the same rewards."""
    options = ["train.max_steps=1", "validation.num_prompts=8", *FAST]
    figures = {}
    for name, url, api in (("vllm", servers[0], "vllm"), ("rlsteps", servers[1], "rlsteps")):
        server = [f"rm.url={url}", f"rm.api={api}"]
        (tmp_path / name).mkdir()
        done = rlsteps("run", "rl/reinforce", "-c", "tiny", *server, *options, cwd=tmp_path / name)
        assert done.returncode == 0, done.stderr[-3000:]
        run = run_dir(tmp_path / name, "rl_reinforce")
        figures[name] = series(run, "val/reward_mean") + series(run, "train/reward")
    assert len(figures["vllm"]) == 2 and all(map(math.isfinite, figures["vllm"]))
    assert figures["vllm"] == pytest.approx(figures["rlsteps"], abs=REWARD_TOLERANCE)
