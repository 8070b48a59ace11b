"""rm.api=triton against a real PyTriton (.venv-triton) serving the tiny reward model under NeMo-Aligner's names
(tests/triton_reward_server.py): NeMo-Aligner's request over Triton's HTTP inference protocol.

The client sends what NeMo-Aligner's RemoteGPTRMClient sends, the policy's token ids of each prompt and response
(`tokens`, INT64, right-padded with 0) and their lengths (`sequence_lengths`, INT64 [B, 1]), and reads `rewards`
(FP32 [B, 1]); each row's reward is the reward model's on exactly its tokens, whatever the rows beside it.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from reward_servers import nemo_aligner_reward_server
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.rewards.rm.client import RewardClient, RewardServerError
from rlsteps.engine.rewards.rm.scorer import RewardScorer
from rlsteps.engine.rewards.sources import RewardModelSource
from run_helpers import FAST, rlsteps, run_dir, series

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # the same model in fp32 on the same CPU, in batches of other sizes


@pytest.fixture(scope="module")
def triton_url(tiny_world, tmp_path_factory):
    with nemo_aligner_reward_server(tiny_world.reward_model, tmp_path_factory.mktemp("triton") / "triton.log") as url:
        yield url


@pytest.fixture(scope="module")
def scorer(tiny_world):
    return RewardScorer(tiny_world.reward_model)


def token_rows(scorer: RewardScorer, count: int = 11) -> list[list[int]]:
    """Rows of 1 to ~60 token ids of the tiny vocabulary: prompts and responses the model reads, of every length."""
    rng = random.Random(0)
    return [[rng.randrange(3, scorer.vocab_size) for _ in range(rng.randint(1, 60))] for _ in range(count)]


def test_nemo_aligners_request_gets_each_rows_reward_from_pytriton(triton_url, scorer):
    rows = token_rows(scorer)
    expected = scorer.score_tokens(rows, max_length=512)
    with RewardClient(triton_url, api="triton", batch_size=4) as client:  # 3 requests, each padded to its longest
        assert client.score_tokens(rows) == pytest.approx(expected, abs=TOLERANCE)
    with RewardClient(triton_url, api="triton", max_length=16, truncation_side="left") as client:
        kept_ends = scorer.score_tokens(rows, max_length=16, truncation_side="left")
        assert client.score_tokens(rows) == pytest.approx(kept_ends, abs=TOLERANCE)
    assert kept_ends != pytest.approx(expected, abs=TOLERANCE)  # the cut mattered


def test_the_reward_source_sends_the_policys_tokens_of_prompt_and_response(triton_url, scorer):
    rows = token_rows(scorer, count=4)
    lengths = torch.tensor([len(r) for r in rows])
    tokens = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)  # right-padded with pad id 0
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
    prompt_lengths = torch.minimum(lengths, torch.tensor(2))
    batch = RolloutBatch(
        tokens=tokens, prompt_lengths=prompt_lengths, response_lengths=lengths - prompt_lengths,
        is_end=torch.ones(len(rows), dtype=torch.bool), prompt_ids=["p"] * len(rows), prompt_texts=["?"] * len(rows),
        response_texts=["!"] * len(rows), pad_id=0,
    )  # fmt: skip
    with RewardClient(triton_url, api="triton") as client:
        scores = RewardModelSource(client, policy_tokens=True).score(batch)
    assert scores.rewards.tolist() == pytest.approx(scorer.score_tokens(rows), abs=TOLERANCE)


def test_a_model_name_the_server_lacks_is_refused_at_once_with_the_fix(triton_url):
    with RewardClient(triton_url, api="triton", model="critic", backoff_s=30) as client:
        with pytest.raises(RewardServerError, match="HTTP 404.*'critic'.*inference.model_name"):
            client.score_tokens([[5, 6, 7]])  # no retry: a 30 s backoff would show


def test_a_tiny_run_trains_on_the_triton_servers_rewards(triton_url, tmp_path):
    options = [f"rm.url={triton_url}", "rm.api=triton", "train.max_steps=1", "validation.num_prompts=8", *FAST]
    done = rlsteps("run", "rl/rs", "-c", "tiny", *options, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(tmp_path, "rl_rs")
    figures = series(run, "val/reward_mean") + series(run, "train/reward")
    assert len(figures) == 2 and all(map(math.isfinite, figures)), figures
