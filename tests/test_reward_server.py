"""The reward scorer, and its HTTP server with dynamic batching, on a real loopback socket."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoTokenizer

from model_fixtures import LINES, PROMPTS, RESPONSES, save_reward_model, serving
from rlsteps.engine.rewards.rm import batching as rm_batching
from rlsteps.engine.rewards.rm import server as rm_server
from rlsteps.engine.rewards.rm.batching import FairBatcher, _Job, estimated_tokens
from rlsteps.engine.rewards.rm.client import RewardClient, RewardServerError
from rlsteps.engine.rewards.rm.protocol import RewardsRequest
from rlsteps.engine.rewards.rm.scorer import RewardScorer
from rlsteps.engine.rewards.rm.server import create_app
from rlsteps.engine.rewards.text import reward_input_text

# a chat template in the fixture tokenizer's terms: each turn "<role>content</s>", then "<assistant>" to generate
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool turns') }}{% endif %}"
    "{% if m['role'] == 'quoting' %}{{ raise_exception('cannot read ' + m['content']) }}{% endif %}"
    "<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_reward_model(tmp_path_factory.mktemp("reward_model"))


@pytest.fixture(scope="module")
def scorer(model_dir: Path) -> RewardScorer:
    return RewardScorer(model_dir, max_length=64, batch_size=4)


@pytest.fixture(scope="module")
def templated(tmp_path_factory: pytest.TempPathFactory) -> RewardScorer:
    """The same reward model, its tokenizer given a chat template."""
    path = save_reward_model(tmp_path_factory.mktemp("templated_reward_model"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return RewardScorer(path, max_length=64, batch_size=4)


class SlowScorer:
    """The real scorer, slowed down so that requests pile up in the queue."""

    def __init__(self, scorer: RewardScorer, delay_s: float) -> None:
        self.inner, self.delay_s = scorer, delay_s

    def __getattr__(self, name: str):  # name, vocab_size, max_length, encode, ...: the real scorer's
        return getattr(self.inner, name)

    def score_tokens(self, token_ids: list[list[int]]) -> list[float]:
        time.sleep(self.delay_s)
        return self.inner.score_tokens(token_ids)


class GatedScorer(SlowScorer):
    """The real scorer, recording the rows of each batch and holding every forward pass until the gate opens."""

    def __init__(self, scorer: RewardScorer, open_gate: bool = False) -> None:
        super().__init__(scorer, delay_s=0.0)
        self.gate, self.entered = threading.Event(), threading.Event()
        self.batches: list[list[list[int]]] = []
        if open_gate:
            self.gate.set()

    def score_tokens(self, token_ids: list[list[int]]) -> list[float]:
        self.batches.append([list(row) for row in token_ids])
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return super().score_tokens(token_ids)


def in_thread(target: Callable[..., object], *args: object, **kwargs: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, kwargs=kwargs, daemon=True)
    thread.start()
    return thread


def wait_for_health(url: str, ready: Callable[[dict], bool], timeout_s: float = 10) -> dict:
    """Poll /health until `ready` holds of it."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = httpx.get(f"{url}/health").json()
        if ready(health):
            return health
        assert time.monotonic() < deadline, f"the server never reached the expected state: {health}"
        time.sleep(0.02)


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


def test_overload_answers_503_with_retry_after_and_the_client_waits_that_long(scorer: RewardScorer) -> None:
    gated = GatedScorer(scorer)
    one = {"prompts": PROMPTS[:1], "responses": RESPONSES[:1]}
    with serving(create_app(gated, max_batch=1, max_wait_ms=0, max_queue=1)) as url:
        first = in_thread(httpx.post, f"{url}/v1/rewards", json=one, timeout=30)  # admitted, held at the gate
        assert gated.entered.wait(10)
        started = time.monotonic()
        refused = httpx.post(f"{url}/v1/rewards", json=one)  # waits at the door, finds no room, is refused
        at_door_s = time.monotonic() - started
        sent: list[float] = []  # when the client sent each attempt
        refusals: list[tuple[float, str]] = []  # when it got each 503, and its Retry-After
        rewards: list[float] = []

        def client_call() -> None:
            with RewardClient(url, backoff_s=0.01) as client:  # its own backoff alone would retry at once
                client._http.event_hooks = {
                    "request": [lambda request: sent.append(time.monotonic())],
                    "response": [
                        lambda r: r.status_code == 503 and refusals.append((time.monotonic(), r.headers["retry-after"]))
                    ],
                }
                rewards.extend(client.score(PROMPTS[:1], RESPONSES[:1]))

        calling = in_thread(client_call)
        wait_for_health(url, lambda h: h["rejected"] == 2)  # the client's first attempt was refused too
        gated.gate.set()  # room again, long before the client comes back
        calling.join(30)
        first.join(30)
        health = httpx.get(f"{url}/health").json()

    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert rm_server.DOOR_WAIT_S <= at_door_s < rm_server.DOOR_WAIT_S + 2
    assert "busy: 1 pairs waiting" in refused.json()["detail"]
    assert len(sent) == 2 and len(refusals) == 1 and health["rejected"] == 2  # one refusal, one retry
    (refused_at, retry_after) = refusals[0]
    assert sent[1] - refused_at >= float(retry_after), "the client came back before the server's Retry-After"
    assert rewards == pytest.approx(scorer.score(PROMPTS[:1], RESPONSES[:1]), abs=1e-5)


def test_retry_after_spreads_refused_clients_over_the_seconds_their_work_needs() -> None:
    batcher = FairBatcher(scorer=None, max_batch=4, max_wait_s=0, max_queue=8)  # type: ignore[arg-type]
    assert batcher.refuse() == 1  # nothing measured yet
    batcher.throughput, batcher.pending, batcher.requests, batcher.admitted_pairs = 100.0, 250, 10, 100
    # 250 pairs queued, 10 pairs per request on average, 100 pairs/s: the 5th client refused has 300 pairs ahead
    assert [batcher.refuse() for _ in range(6)] == [3, 3, 3, 3, 3, 4]
    assert batcher.rejected == 7


def test_a_request_finding_the_queue_full_waits_its_turn_at_the_door(scorer: RewardScorer) -> None:
    gated = GatedScorer(scorer)
    rows = {name: [[first, 3]] for name, first in (("a", 5), ("b", 6), ("c", 7))}
    answers: dict[str, int] = {}

    def post(url: str, name: str) -> None:
        answers[name] = httpx.post(f"{url}/v1/rewards", json={"tokens": rows[name]}, timeout=30).status_code

    # a door that waits long: on a loaded machine, the polls below may take longer than the usual second
    with serving(create_app(gated, max_batch=1, max_wait_ms=0, max_queue=1, door_wait_s=30)) as url:
        threads = [in_thread(post, url, "a")]
        assert gated.entered.wait(10)  # a is being scored: the queue is full
        threads.append(in_thread(post, url, "b"))
        wait_for_health(url, lambda h: h["waiting"] == 1)
        threads.append(in_thread(post, url, "c"))
        wait_for_health(url, lambda h: h["waiting"] == 2)
        gated.gate.set()  # room again within the door's wait: b, then c, are let in
        for t in threads:
            t.join(30)
        health = httpx.get(f"{url}/health").json()
    assert answers == {"a": 200, "b": 200, "c": 200} and health["rejected"] == 0
    assert gated.batches == [rows["a"], rows["b"], rows["c"]]
    assert health["waiting"] == 0 and health["queue"] == 0


def test_a_big_request_does_not_starve_small_ones(scorer: RewardScorer) -> None:
    gated = GatedScorer(scorer)
    big = [[10 + i, 2] for i in range(24)]  # 6 batches of 4
    smalls = [[[200 + k, 7]] for k in range(3)]
    done: list[str] = []
    lock = threading.Lock()

    def post(url: str, name: str, rows: list[list[int]]) -> None:
        answer = httpx.post(f"{url}/v1/rewards", json={"tokens": rows}, timeout=60)
        assert answer.status_code == 200, answer.text
        with lock:
            done.append(name)

    with serving(create_app(gated, max_batch=4, max_wait_ms=0, max_queue=100)) as url:
        threads = [in_thread(post, url, "big", big)]
        assert gated.entered.wait(10)  # the big request's first 4 rows are being scored
        threads += [in_thread(post, url, f"small{k}", rows) for k, rows in enumerate(smalls)]
        wait_for_health(url, lambda h: h["requests"] == 4)
        gated.delay_s = 0.2  # from here each batch takes 0.2 s: the big one needs 4 batches after the smalls'
        gated.gate.set()
        for t in threads:
            t.join(30)

    assert done[-1] == "big" and sorted(done[:3]) == ["small0", "small1", "small2"]
    # round-robin: the big request's next piece, then the three small ones and one row of the big one, then the rest
    assert gated.batches[:2] == [big[0:4], big[4:8]]
    assert sorted(gated.batches[2][:3]) == [row for rows in smalls for row in rows] and gated.batches[2][3] == big[8]
    assert [row for batch in gated.batches for row in batch if row[0] < 200] == big
    assert len(gated.batches) == 7


def test_a_batch_holds_at_most_its_token_budget_and_at_least_one_pair() -> None:
    loop = asyncio.new_event_loop()
    batcher = FairBatcher(scorer=None, max_batch=8, max_wait_s=0, max_queue=100, max_batch_tokens=10)  # type: ignore[arg-type]
    for rows in ([[1] * 6] * 3, [[2]] * 3, [[3] * 20]):  # pairs of 6 tokens, of 1, and one over the budget alone
        request = RewardsRequest(tokens=rows)
        costs = estimated_tokens(request, max_length=64)
        batcher.jobs.append(
            _Job(request, loop.create_future(), 64, "left", len(rows), costs, rewards=[0.0] * len(rows))
        )
        batcher.untaken += len(rows)
    batches = []
    while batcher.jobs:
        batches.append([(piece.job.request.tokens[0][0], piece.stop - piece.start) for piece in batcher._take()])
    loop.close()
    # (first token, pairs) per piece: 6 + 1 + 1 + 1 tokens; the 20-token pair alone; then 6 tokens at a time
    assert batches == [[(1, 1), (2, 3)], [(3, 1)], [(1, 1)], [(1, 1)]]
    text = RewardsRequest(prompts=["x" * 1000, "abcd"], responses=["y" * 3, ""])
    assert estimated_tokens(text, max_length=512) == [251, 2]  # characters / 4 (+1), at most max_length
    assert estimated_tokens(text, max_length=100) == [100, 2]


def test_a_request_larger_than_a_batch_is_scored_in_pieces_as_if_alone(scorer: RewardScorer) -> None:
    recorder = GatedScorer(scorer, open_gate=True)
    with serving(create_app(recorder, max_batch=2, max_queue=4)) as url:
        answer = httpx.post(f"{url}/v1/rewards", json={"prompts": PROMPTS, "responses": RESPONSES})
    assert answer.status_code == 200
    assert [len(batch) for batch in recorder.batches] == [2, 2, 2, 1]
    assert answer.json()["rewards"] == pytest.approx(scorer.score(PROMPTS, RESPONSES), abs=1e-5)


def test_an_oversize_body_gets_413_and_the_server_answers_the_next_request(scorer: RewardScorer) -> None:
    oversize = {"prompts": ["x" * 20_000], "responses": ["y"]}

    def streamed():  # no Content-Length: counted as it arrives
        yield b'{"prompts": ["'
        for _ in range(20):
            yield b"x" * 1000
        yield b'"], "responses": ["y"]}'

    with serving(create_app(scorer, max_request_mb=0.01)) as url, httpx.Client() as http:
        declared = http.post(f"{url}/v1/rewards", json=oversize)  # refused on its Content-Length, unread
        chunked = http.post(f"{url}/v1/rewards", content=streamed(), headers={"Content-Type": "application/json"})
        after = http.post(f"{url}/v1/rewards", json={"prompts": PROMPTS[:2], "responses": RESPONSES[:2]})
        with RewardClient(url) as client, pytest.raises(RewardServerError, match="HTTP 413.*rm.batch_size"):
            client.score(oversize["prompts"], oversize["responses"])

    assert declared.status_code == 413 and "over the server's limit of 10000 bytes" in declared.json()["detail"]
    assert chunked.status_code == 413
    assert after.status_code == 200 and len(after.json()["rewards"]) == 2


def test_truncation_from_the_request_reaches_the_scorer(scorer: RewardScorer) -> None:
    recorder = GatedScorer(scorer, open_gate=True)
    with serving(create_app(recorder)) as url:
        with RewardClient(url, max_length=3, truncation_side="right") as right:
            kept_start = right.score_tokens([[5, 6, 7, 8, 9]])
        with RewardClient(url, max_length=3, truncation_side="left") as left:
            kept_end = left.score_tokens([[5, 6, 7, 8, 9]])
        with RewardClient(url, max_length=4, truncation_side="right") as texts:
            texts.score(PROMPTS[4:5], RESPONSES[4:5])
        with RewardClient(url) as defaults:  # the server's own: 64 tokens, cut on the left
            defaults.score_tokens([list(range(1, 71))])
        too_long = httpx.post(f"{url}/v1/rewards", json={"tokens": [[5]], "max_length": 65})

    full = scorer.tokenizer(reward_input_text(PROMPTS[4], RESPONSES[4], scorer.tokenizer.eos_token))["input_ids"]
    assert len(full) > 4
    assert recorder.batches == [[[5, 6, 7]], [[7, 8, 9]], [full[:4]], [list(range(7, 71))]]
    assert kept_start == pytest.approx(scorer.score_tokens([[5, 6, 7]]), abs=1e-6)
    assert kept_end == pytest.approx(scorer.score_tokens([[7, 8, 9]]), abs=1e-6)
    assert too_long.status_code == 422 and "--max-length 64" in too_long.json()["detail"]


def test_conversations_are_read_through_the_reward_models_chat_template(
    templated: RewardScorer, scorer: RewardScorer
) -> None:
    conversations = [
        [{"role": "user", "content": "the cat"}],
        [{"role": "system", "content": "count:"}, {"role": "user", "content": "1 2"}],
    ]
    responses = [" sat on the mat.", " 3 4"]
    by_hand = ["<user>the cat</s><assistant> sat on the mat.</s>", "<system>count:</s><user>1 2</s><assistant> 3 4</s>"]
    assert [templated.conversation_text(c, r) for c, r in zip(conversations, responses)] == by_hand
    ids = templated.tokenizer(by_hand, add_special_tokens=False)["input_ids"]
    assert templated.encode_conversations(conversations, responses) == ids
    # here the policy's text (its rendered prompt + response + EOS) is the same string
    rendered = [
        templated.tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations
    ]
    assert templated.encode(rendered, responses) == ids

    tool_turn = {"conversations": [[{"role": "tool", "content": "{}"}]], "responses": ["x"]}
    secret_turn = {"role": "quoting", "content": "what the client sent 7f3e"}  # a template that quotes it
    with serving(create_app(templated)) as url:
        with RewardClient(url) as client:
            rewards = client.score_conversations(conversations, responses)
        refused = httpx.post(f"{url}/v1/rewards", json=tool_turn)
        quoted = httpx.post(f"{url}/v1/rewards", json={"conversations": [[secret_turn]], "responses": ["x"]})
    with serving(create_app(scorer)) as url:  # a tokenizer without a chat template
        untemplated = httpx.post(f"{url}/v1/rewards", json={"conversations": conversations, "responses": responses})

    assert rewards == pytest.approx(templated.score_tokens(ids), abs=1e-5)
    assert refused.status_code == 422 and "no tool turns" in refused.json()["detail"]
    assert quoted.status_code == 422 and "7f3e" not in quoted.text  # the template's words, never what was sent
    assert "TemplateError: cannot read (text sent)" in quoted.json()["detail"], quoted.text
    assert untemplated.status_code == 422 and "rm.chat_template: policy" in untemplated.json()["detail"]


def test_memory_is_given_back_once_the_queue_is_idle(scorer: RewardScorer, monkeypatch: pytest.MonkeyPatch) -> None:
    trimmed = threading.Event()
    monkeypatch.setattr(rm_batching, "release_free_memory", trimmed.set)
    with serving(create_app(scorer)) as url:
        assert not trimmed.wait(rm_batching.IDLE_BEFORE_TRIM_S + 0.3), "trimmed before any work"
        answer = httpx.post(f"{url}/v1/rewards", json={"prompts": PROMPTS, "responses": RESPONSES})
        assert trimmed.wait(10), "the memory was not given back after the burst"
    assert answer.status_code == 200


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


def test_rm_api_triton_at_an_rlsteps_server_says_no_triton_answers_there(scorer: RewardScorer) -> None:
    """rm.api=triton pointed at `rlsteps serve rm`: its 404 is not a missing model but a server of another protocol,
    told from what GET /v2 answers (Triton's server metadata; nothing here)."""
    from rlsteps.engine.rewards.rm.client import RewardServerError

    with serving(create_app(scorer)) as url, RewardClient(url, api="triton", backoff_s=30) as client:
        with pytest.raises(RewardServerError) as refused:
            client.score_tokens([[5, 6, 7]])
    message = str(refused.value)
    assert "HTTP 404" in message and "no Triton server answers there" in message, message
    assert "for `rlsteps serve rm` set rm.api=rlsteps" in message and "no such model there" not in message
