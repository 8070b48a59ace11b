"""Where a step's rewards come from: each of the config's `rewards:` terms is a scalar reward model over HTTP, a
generative judge comparing a prompt's responses, or a Python function (rlsteps.engine.rewards.combined sums them).

Each source scores a RolloutBatch into per-row rewards and a validity mask (False: no trustworthy
reward, the row leaves the loss). Without a URL in the config, a served source starts its own server on
loopback for the run's lifetime (the tiny configs do this). It starts it and goes on: the server loads
while the worker loads its policy and generates, and the first score waits until it answers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rlsteps.contract.config import RecipeConfig
from rlsteps.contract.reward_config import RewardEntry
from rlsteps.engine.rewards.functions import FunctionScorer
from rlsteps.engine.rewards.process import LocalServer
from rlsteps.engine.rewards.scores import RewardSource, Scores, nothing_to_wait_for

if TYPE_CHECKING:  # torch is imported where a score is made: a worker starts its server before it imports torch
    from rlsteps.engine.batch import RolloutBatch

log = logging.getLogger(__name__)
TOKEN_ENV = "RLSTEPS_LOCAL_SERVER_TOKEN"
RM_SERVER, JUDGE_SERVER = "rlsteps.engine.rewards.rm", "rlsteps.engine.rewards.judge"  # what `python -m` starts
# config keys passed to the clients as they are (the sections name them as the clients do)
RM_CLIENT_OPTIONS = {
    "token", "timeout_s", "max_retries", "backoff_s", "batch_size", "concurrency", "max_length", "truncation_side",
    "api", "model",
}  # fmt: skip
JUDGE_CLIENT_OPTIONS = {
    "api_key", "concurrency", "timeout_s", "max_retries", "temperature", "top_p", "max_tokens", "pairing",
    "both_orders", "principle", "structured_output", "extra_body",
}  # fmt: skip


class RewardModelSource:
    """A scalar reward model behind `rlsteps serve rm`, vLLM's pooling server or NeMo-Aligner's reward server.

    chat_template "policy" sends each prompt as the policy saw it (rendered with the policy's chat template);
    "reward_model" sends the conversation's messages, for the server to render with the reward model's own
    template (a reward model trained on another template than the policy's reads its own). policy_tokens sends the
    policy's own token ids of each prompt and response instead, as NeMo-Aligner's actors do (rm.api=triton)."""

    def __init__(
        self,
        client,
        ready: Callable[[], None] = nothing_to_wait_for,
        chat_template: str = "policy",
        policy_tokens: bool = False,
    ) -> None:
        if chat_template not in ("policy", "reward_model"):
            raise ValueError(f"chat_template must be policy or reward_model, got {chat_template!r}")
        self.client = client
        self.ready = ready  # returns once the server answers (a local server still loading)
        self.chat_template = chat_template
        self.policy_tokens = policy_tokens

    def score(self, batch: RolloutBatch) -> Scores:
        import torch

        self.ready()
        if self.policy_tokens:
            lengths = batch.sequence_lengths.tolist()
            rewards = self.client.score_tokens([row[:n] for row, n in zip(batch.tokens.tolist(), lengths)])
        elif self.chat_template == "reward_model":
            conversations = [batch.conversation(i) for i in range(len(batch))]
            rewards = self.client.score_conversations(conversations, batch.response_texts)
        else:
            rewards = self.client.score(batch.prompt_texts, batch.response_texts)
        return Scores(
            rewards=torch.tensor(rewards, dtype=torch.float32), valid=torch.ones(len(batch), dtype=torch.bool)
        )

    score_alone = score  # a reward model scores each response on its own


class FunctionSource:
    """A reward function in process (rlsteps.engine.rewards.functions); None from it masks the row."""

    def __init__(self, scorer: FunctionScorer) -> None:
        self.scorer = scorer

    def score(self, batch: RolloutBatch) -> Scores:
        import torch

        values = self.scorer(batch)
        rewards = torch.tensor([0.0 if v is None else v for v in values], dtype=torch.float32)
        return Scores(rewards=rewards, valid=torch.tensor([v is not None for v in values], dtype=torch.bool))

    score_alone = score


@contextlib.contextmanager
def term_source(cfg: RecipeConfig, entry: RewardEntry, name: str, run_dir: Path) -> Iterator[RewardSource]:
    """The source of one rewards entry: its server started (and stopped after) where it serves one."""
    if entry.source == "reward_model":
        with _reward_model_source(cfg, run_dir) as source:
            yield source
    elif entry.source == "judge":
        with _judge_source(cfg, run_dir) as source:
            yield source
    else:
        yield FunctionSource(FunctionScorer.load(name, entry.function, entry.batched, entry.timeout_s))


@contextlib.contextmanager
def _reward_model_source(cfg, run_dir: Path) -> Iterator[RewardModelSource]:
    rm, model = cfg.rm, cfg.inputs.model_extra.get("reward_model")
    server_args, log_path = local_rm_server_args(rm), run_dir / "rm_server.log"
    with _served(RM_SERVER, rm.url, model, log_path, server_args, rm.token, cfg.run.num_threads) as (url, ready):
        from rlsteps.engine.rewards.rm.client import RewardClient  # once the server is on its way (httpx: 0.3 s)

        fix = unavailable_fix("reward server", "rm.url", rm.url, log_path)
        client = RewardClient(url, unavailable_fix=fix, **rm.model_dump(include=RM_CLIENT_OPTIONS))
        log.info("reward model at %s: %s", url, client.patience())
        with contextlib.closing(client):
            yield RewardModelSource(client, ready, rm.chat_template, policy_tokens=rm.api == "triton")


def unavailable_fix(what: str, url_key: str, given_url: str | None, log_path: Path) -> str:
    """What to do when a served source stops answering: a server given by URL is the user's to check; one this run
    started has its log in the run directory, and a rerun starts it afresh."""
    if given_url:
        return f"check the {what} at {url_key}: is it up, and reachable from here?"
    return f"the {what} this run started stopped answering (its log: {log_path}); a rerun starts it afresh"


def local_rm_server_args(rm) -> list[str]:
    """Options of the reward server a run starts for itself, from its rm section. The run's client is its only
    client: a queue of all that it sends at once (concurrency x batch_size pairs) never answers it 503."""
    args = ["--device", rm.server.device, "--dtype", rm.server.dtype]
    args += ["--max-batch", str(rm.server.max_batch), "--max-wait-ms", str(rm.server.max_wait_ms)]
    args += ["--max-queue", str(rm.concurrency * rm.batch_size), "--truncation-side", rm.truncation_side]
    return args + (["--max-length", str(rm.max_length)] if rm.max_length is not None else [])


@contextlib.contextmanager
def _judge_source(cfg: RecipeConfig, run_dir: Path) -> Iterator[RewardSource]:
    j, model = cfg.judge, cfg.inputs.model_extra.get("judge_model")
    model_name = j.model or "judge"
    naming, log_path = ["--model-name", model_name], run_dir / "judge_server.log"
    with _served(JUDGE_SERVER, j.url, model, log_path, naming, j.api_key, cfg.run.num_threads) as (url, ready):
        from rlsteps.engine.rewards.judge.client import JudgeClient  # once the server is on its way
        from rlsteps.engine.rewards.judge.source import JudgeSource

        options = j.model_dump(include=JUDGE_CLIENT_OPTIONS)
        fix = unavailable_fix("judge", "judge.url", j.url, log_path)
        client = JudgeClient(url if j.url else f"{url}/v1", model_name, unavailable_fix=fix, **options)
        log.info("judge at %s: %s", client.url, client.patience())
        with contextlib.closing(client):
            yield JudgeSource(
                client,
                length_penalty=j.length_penalty,
                on_failure=j.on_failure,
                max_parse_failure_rate=j.max_parse_failure_rate,
                ready=ready,
                max_failure_rate=j.max_failure_rate,
                reference_path=run_dir / "validation_references.json",
            )


@contextlib.contextmanager
def _served(
    module: str,
    url: str | None,
    model: str | None,
    log_path: Path,
    args: list[str],
    token: str | None,
    threads: int | None = None,
) -> Iterator[tuple[str, Callable[[], None]]]:
    """(URL, wait until it answers): the given URL, or a server started on loopback for the model, loading while
    the block goes on (stopped when the block ends). `threads` (run.num_threads) sets the server's torch threads as
    the worker's: a server left at torch's default takes every core, and two runs side by side on a small machine
    then spin their servers' threads against each other (two tiny runs on 2 cores: a step's scoring 0.47 s, against
    0.10 s with one thread a server)."""
    if url:
        yield url.rstrip("/"), nothing_to_wait_for
        return
    if not model:
        raise ValueError(f"no server URL and no model to serve for {module}: set the URL or the model input")
    env = {TOKEN_ENV: token} if token else {}
    options = ["--token-env", TOKEN_ENV] if token else []
    options += ["--threads", str(threads)] if threads else []
    server = LocalServer(module, ["--model", str(model), *args, *options], log_path=log_path, env=env or None)
    try:
        server.start(wait=False)
        log.info(
            "started %s for %s (log: %s); it has %ss to load and answer",
            module,
            model,
            log_path,
            f"{server.startup_timeout_s:g}",
        )
        yield server.url, server.wait_until_ready
    finally:
        server.stop()
