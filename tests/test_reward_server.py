"""The reward scorer, and its HTTP server with dynamic batching, on a real loopback socket."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from model_fixtures import LINES, PROMPTS, RESPONSES, save_reward_model, serving
from rlsteps.engine.rewards.rm.client import RewardClient
from rlsteps.engine.rewards.rm.scorer import RewardScorer
from rlsteps.engine.rewards.rm.server import create_app
from rlsteps.engine.rewards.text import reward_input_text


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_reward_model(tmp_path_factory.mktemp("reward_model"))


@pytest.fixture(scope="module")
def scorer(model_dir: Path) -> RewardScorer:
    return RewardScorer(model_dir, max_length=64, batch_size=4)


class SlowScorer:
    """The real scorer, slowed down so that requests pile up in the queue."""

    def __init__(self, scorer: RewardScorer, delay_s: float) -> None:
        self.inner, self.delay_s, self.name, self.vocab_size = scorer, delay_s, scorer.name, scorer.vocab_size

    def encode(self, prompts: list[str], responses: list[str]) -> list[list[int]]:
        return self.inner.encode(prompts, responses)

    def score_tokens(self, token_ids: list[list[int]]) -> list[float]:
        time.sleep(self.delay_s)
        return self.inner.score_tokens(token_ids)


# --- the scorer ---------------------------------------------------------------------------


def test_rewards_do_not_depend_on_the_batch(scorer: RewardScorer) -> None:
    batched = scorer.score(PROMPTS, RESPONSES)  # 7 rows of different lengths in sub-batches of 4
    one_by_one = [scorer.score([p], [r])[0] for p, r in zip(PROMPTS, RESPONSES)]
    assert torch.allclose(torch.tensor(batched), torch.tensor(one_by_one), atol=1e-5)
    assert torch.tensor(batched).std() > 0.01  # distinct rewards: the comparison above can fail
    reversed_order = scorer.score(PROMPTS[::-1], RESPONSES[::-1])[::-1]
    assert torch.allclose(torch.tensor(batched), torch.tensor(reversed_order), atol=1e-5)


def test_scorer_reads_the_shared_reward_text(scorer: RewardScorer) -> None:
    text = reward_input_text(PROMPTS[0], RESPONSES[0], scorer.tokenizer.eos_token)
    ids = scorer.tokenizer(text)["input_ids"]
    assert ids[-1] == scorer.tokenizer.eos_token_id
    assert scorer.encode(PROMPTS[:1], RESPONSES[:1]) == [ids]
    assert scorer.score(PROMPTS[:1], RESPONSES[:1]) == pytest.approx(scorer.score_tokens([ids]), abs=1e-6)


def test_long_inputs_keep_their_end(scorer: RewardScorer) -> None:
    long_prompt = " ".join(LINES[:20])
    full = scorer.tokenizer(reward_input_text(long_prompt, " the end.", scorer.tokenizer.eos_token))["input_ids"]
    assert len(full) > scorer.max_length
    (kept,) = scorer.encode([long_prompt], [" the end."])
    assert kept == full[-scorer.max_length :]
    assert scorer.score_tokens([full]) == pytest.approx(scorer.score_tokens([kept]), abs=1e-6)


def test_scorer_needs_a_pad_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no pad token"):
        RewardScorer(save_reward_model(tmp_path, with_pad=False))


# --- the server -------------------------------------------------------------------------


def test_concurrent_clients_are_batched_and_get_their_own_rewards(scorer: RewardScorer) -> None:
    requests = [[(PROMPTS[(i + k) % 7], RESPONSES[(i * 3 + k) % 7]) for k in range(1 + i % 3)] for i in range(64)]
    alone = {pair: scorer.score([pair[0]], [pair[1]])[0] for pairs in requests for pair in pairs}  # unbatched
    expected = [[alone[pair] for pair in pairs] for pairs in requests]
    answers: list[list[float] | None] = [None] * 64
    app = create_app(scorer, max_batch=64, max_wait_ms=20)
    with serving(app) as url:
        start = threading.Barrier(64)

        def one_client(i: int) -> None:
            with RewardClient(url, backoff_s=0.05) as client:
                start.wait()
                answers[i] = client.score(*zip(*requests[i]))

        threads = [threading.Thread(target=one_client, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        health = httpx.get(f"{url}/health").json()

    for got, want in zip(answers, expected):
        assert got is not None and torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-5)
    assert health["requests"] == 64 and health["queue"] == 0 and health["status"] == "ok"
    assert health["batches"] < 64, f"no batching happened: {health}"


def test_token_ids_are_scored_like_texts(scorer: RewardScorer) -> None:
    rows = scorer.encode(PROMPTS, RESPONSES)
    with serving(create_app(scorer)) as url:
        answer = httpx.post(f"{url}/v1/rewards", json={"tokens": rows})
        with RewardClient(url, batch_size=3) as client:
            from_client = client.score_tokens(rows)
    assert answer.status_code == 200
    want = scorer.score(PROMPTS, RESPONSES)
    assert answer.json()["rewards"] == pytest.approx(want, abs=1e-5)
    assert from_client == pytest.approx(want, abs=1e-5)


def test_full_queue_answers_503_and_the_client_waits_its_turn(scorer: RewardScorer) -> None:
    app = create_app(SlowScorer(scorer, delay_s=0.2), max_batch=1, max_wait_ms=0, max_queue=2)
    with serving(app) as url:
        responses: list[httpx.Response] = []
        lock = threading.Lock()

        def post(i: int) -> None:
            answer = httpx.post(f"{url}/v1/rewards", json={"prompts": [PROMPTS[i % 7]], "responses": ["x"]}, timeout=30)
            with lock:
                responses.append(answer)

        threads = [threading.Thread(target=post, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        with RewardClient(url, batch_size=1, concurrency=6, backoff_s=0.05, max_retries=10) as client:
            rewards = client.score(PROMPTS[:6], RESPONSES[:6])

    codes = sorted(r.status_code for r in responses)
    assert 503 in codes and 200 in codes and set(codes) == {200, 503}, codes
    assert all(r.headers["retry-after"] == "1" for r in responses if r.status_code == 503)
    assert rewards == pytest.approx(scorer.score(PROMPTS[:6], RESPONSES[:6]), abs=1e-5)


def test_bearer_token(scorer: RewardScorer) -> None:
    body = {"prompts": PROMPTS[:2], "responses": RESPONSES[:2]}
    with serving(create_app(scorer, token="s3cret")) as url:
        missing = httpx.post(f"{url}/v1/rewards", json=body)
        wrong = httpx.post(f"{url}/v1/rewards", json=body, headers={"Authorization": "Bearer nope"})
        right = httpx.post(f"{url}/v1/rewards", json=body, headers={"Authorization": "Bearer s3cret"})
        health = httpx.get(f"{url}/health")
        with RewardClient(url, token="s3cret") as client:
            assert client.score(PROMPTS[:2], RESPONSES[:2]) == pytest.approx(right.json()["rewards"])
    assert missing.status_code == 401 and wrong.status_code == 401
    assert "bearer token" in missing.json()["detail"]
    assert right.status_code == 200 and health.status_code == 200


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"prompts": ["a", "b"], "responses": ["c"]}, "different lengths"),
        ({"prompts": ["a"]}, "together"),
        ({}, "either"),
        ({"prompts": ["a"], "responses": ["b"], "tokens": [[1]]}, "either"),
        ({"tokens": [[1, 2], []]}, "empty row"),
        ({"tokens": [["x"]]}, "tokens"),
        ({"tokens": [[1, 2], [100000]]}, "outside the reward model's vocabulary"),
    ],
)
def test_invalid_requests_get_422_naming_the_field(scorer: RewardScorer, body: dict, named: str) -> None:
    with serving(create_app(scorer)) as url:
        answer = httpx.post(f"{url}/v1/rewards", json=body)
    assert answer.status_code == 422
    assert named in answer.text


def test_a_request_larger_than_the_queue_is_refused(scorer: RewardScorer) -> None:
    with serving(create_app(scorer, max_queue=4)) as url:
        answer = httpx.post(f"{url}/v1/rewards", json={"prompts": PROMPTS[:5], "responses": RESPONSES[:5]})
    assert answer.status_code == 413 and "smaller requests" in answer.json()["detail"]
