"""The tiny judge server: a reward model behind an OpenAI-compatible chat API, on a loopback socket."""

from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from model_fixtures import save_reward_model, serving
from rlsteps.engine.rewards.judge.client import JudgeClient
from rlsteps.engine.rewards.judge.parsing import parse_judgement
from rlsteps.engine.rewards.judge.protocol import JudgeRequest, comparison_pairs, judge_messages
from rlsteps.engine.rewards.judge.scale import JUDGE_SCALE_KEY, RewardScale, reward_scale_of
from rlsteps.engine.rewards.judge.server import JudgeBatcher, create_app, judgement_from_rewards
from rlsteps.engine.rewards.rm.scorer import RewardScorer

PROMPT = "Q: name an animal. A:"
CONVERSATION = [{"role": "user", "content": PROMPT}]  # the scorer's tokenizer has no chat template: read as PROMPT
CANDIDATES = [" cat", " the dog ran", " 1 2 3", " a cat sat on the mat.", " why?", " dog dog dog"]


@pytest.fixture(scope="module")
def scorer(tmp_path_factory: pytest.TempPathFactory) -> RewardScorer:
    """A small random Llama reward model with a byte-level BPE tokenizer trained on the test texts."""
    path = save_reward_model(tmp_path_factory.mktemp("judge_reward_model"), [PROMPT, *CANDIDATES] * 10, layers=1)
    return RewardScorer(path, max_length=64)


def test_judgement_from_rewards_hand_values():
    # each score rates its own response: 1 + 4 sigmoid((r - center) / scale); center 0, scale 2
    assert judgement_from_rewards(0.0, 0.0) == {"score_1": 3.0, "score_2": 3.0, "ranking": 3.5}
    assert judgement_from_rewards(0.7, 0.7, RewardScale(0.7, 1.0)) == {"score_1": 3.0, "score_2": 3.0, "ranking": 3.5}
    # sigmoid(ln 3) = 0.75: score_1 = 1 + 4 * 0.75 = 4; p = 0.75 -> ranking = 1 + 5 * 0.25 = 2.25
    assert judgement_from_rewards(2 * math.log(3), 0.0) == {"score_1": 4.0, "score_2": 3.0, "ranking": 2.25}
    # a difference of ln 3 makes p = 3/4
    assert judgement_from_rewards(-1e6, 1e6) == {"score_1": 1.0, "score_2": 5.0, "ranking": 6.0}


def test_a_reward_models_own_scale_is_read_from_its_config(tmp_path: Path):
    """No entry: center 0, scale 2. An entry: its center scores 3 and a reward `scale` ln 3 above it 4 (sigmoid(ln 3)
    = 3/4). A malformed entry: a ValueError naming the file and the key."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"]}))
    assert reward_scale_of(tmp_path) == RewardScale(0.0, 2.0)
    config.write_text(json.dumps({JUDGE_SCALE_KEY: {"center": 10.0, "scale": 5.0}}))
    own = reward_scale_of(tmp_path)
    assert own == RewardScale(10.0, 5.0) and own.score(10.0) == 3.0
    assert own.score(10.0 + 5.0 * math.log(3)) == pytest.approx(4.0)
    assert judgement_from_rewards(10.0 + 5.0 * math.log(3), 10.0, own) == {
        "score_1": 4.0,
        "score_2": 3.0,
        "ranking": 2.25,
    }
    for entry in ({"center": 1.0}, {"center": 0.0, "scale": 0.0}, {"center": "x", "scale": 1.0}, [1, 2]):
        config.write_text(json.dumps({JUDGE_SCALE_KEY: entry}))
        with pytest.raises(ValueError, match=f"config.json: {JUDGE_SCALE_KEY} must be"):
            reward_scale_of(tmp_path)


def test_the_better_scored_response_wins_through_the_client(scorer: RewardScorer):
    direct = scorer.score([PROMPT] * len(CANDIDATES), CANDIDATES)
    ranked = sorted(range(len(CANDIDATES)), key=direct.__getitem__)
    low, mid, high = (CANDIDATES[i] for i in (ranked[0], ranked[len(ranked) // 2], ranked[-1]))
    assert direct[ranked[-1]] - direct[ranked[0]] > 0.1, "the random reward model separates nothing"
    with serving(create_app(scorer, "tiny-judge"), path="/v1") as url, JudgeClient(url, "tiny-judge") as client:
        result = client.judge([(CONVERSATION, [mid, low, high]), (CONVERSATION, [low, high])])
    assert result.valid == [[True, True, True], [True, True]]
    assert result.stats["parse_failures"] == 0 and result.stats["retries"] == 0
    rewards_mid, rewards_low, rewards_high = result.rewards[0]
    assert rewards_high > rewards_mid > rewards_low
    assert result.rewards[1][1] > result.rewards[1][0]
    # the two rewards of a single comparison are the judge's two scores
    expected = judgement_from_rewards(direct[ranked[0]], direct[ranked[-1]])
    assert result.rewards[1] == pytest.approx([expected["score_1"], expected["score_2"]])


def test_openai_endpoints_and_the_answer_format(scorer: RewardScorer):
    with serving(create_app(scorer, "tiny-judge"), path="/v1") as url:
        assert httpx.get(url.removesuffix("/v1") + "/health").json()["status"] == "ok"
        assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "tiny-judge"
        answer = httpx.post(f"{url}/chat/completions", json={
            "model": "tiny-judge", "messages": judge_messages(CONVERSATION, CANDIDATES[0], CANDIDATES[1], None),
        }).json()  # fmt: skip
    assert answer["object"] == "chat.completion" and answer["model"] == "tiny-judge"
    content = answer["choices"][0]["message"]["content"]
    assert content.startswith("```json\n") and content.endswith("\n```")
    judgement = parse_judgement(content)
    r1, r2 = scorer.score([PROMPT, PROMPT], [CANDIDATES[0], CANDIDATES[1]])
    expected = judgement_from_rewards(r1, r2)
    assert (judgement.score_1, judgement.score_2, judgement.ranking) == pytest.approx(
        (expected["score_1"], expected["score_2"], expected["ranking"]), abs=1e-3
    )


def test_the_tiny_judge_says_position_cannot_sway_it_and_one_order_gives_the_rewards_of_both(scorer: RewardScorer):
    """Its verdict on a pair shown the other way round is the mirror of the first, as its /v1/models entry says: the
    client (both orders asked for, the default) shows each pair once and gets the rewards both orders give."""
    groups = [(CONVERSATION, CANDIDATES[:4]), (CONVERSATION, CANDIDATES[2:])]
    with serving(create_app(scorer, "tiny-judge", token="s3cret"), path="/v1") as url:
        models = httpx.get(f"{url}/models", headers={"Authorization": "Bearer s3cret"}).json()
        with JudgeClient(url, "tiny-judge", api_key="s3cret") as once:
            shown_once = once.judge(groups)
        with JudgeClient(url, "tiny-judge", api_key="s3cret") as both:
            both.position_independent = False  # as a judge that says nothing is taken
            shown_both = both.judge(groups)
    assert models["data"][0]["rlsteps"] == {"position_independent": True}
    assert once.position_independent is True
    assert shown_once.stats["comparisons"] == 8 and shown_both.stats["comparisons"] == 16
    assert shown_once.rewards == shown_both.rewards and shown_once.valid == shown_both.valid
    assert len({r for group in shown_once.rewards for r in group}) > 4  # rewards that tell the responses apart
    assert "first_position_rate" not in shown_once.stats and shown_both.stats["first_position_rate"] == 0.5


def test_unreadable_requests_get_400_with_the_reason(scorer: RewardScorer):
    with serving(create_app(scorer), path="/v1") as url:
        not_json = httpx.post(f"{url}/chat/completions", content=b"{oops", headers={"Content-Type": "application/json"})
        no_messages = httpx.post(f"{url}/chat/completions", json={"model": "tiny-judge"})
        free_text = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]
    assert no_messages.status_code == 400 and "'messages'" in no_messages.json()["error"]["message"]
    assert free_text.status_code == 400 and "[RESPONSE 1]" in free_text.json()["error"]["message"]


def test_an_oversize_body_gets_413_and_other_paths_and_methods_go_to_the_app(scorer: RewardScorer):
    with serving(create_app(scorer), path="/v1") as url:
        oversize = httpx.post(f"{url}/chat/completions", content=b"x" * 8_000_001)
        wrong_method = httpx.get(f"{url}/chat/completions")
        unknown = httpx.post(f"{url}/completions", json={})
    assert oversize.status_code == 413 and "over 8000000 bytes" in oversize.json()["error"]["message"]
    assert wrong_method.status_code in (404, 405) and unknown.status_code == 404


def test_token_is_required_when_set(scorer: RewardScorer):
    body = {"model": "tiny-judge", "messages": judge_messages(CONVERSATION, " cat", " dog", None)}
    with serving(create_app(scorer, token="s3cret"), path="/v1") as url:
        refused = httpx.post(f"{url}/chat/completions", json=body)
        wrong = httpx.post(f"{url}/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        with JudgeClient(url, "tiny-judge", api_key="s3cret") as client:
            result = client.judge([(CONVERSATION, [" cat", " dog"])])
    assert refused.status_code == 401 and wrong.status_code == 401
    assert result.valid == [[True, True]]


# --- batching: concurrent comparisons share forward passes -----------------------------------------


class CountingScorer:
    """The real scorer, counting its calls (each one forward pass here: fewer rows than its batch_size)."""

    def __init__(self, scorer: RewardScorer, fail_on: str | None = None) -> None:
        self.scorer, self.fail_on = scorer, fail_on
        self.calls: list[int] = []  # rows per call
        self.lock = threading.Lock()

    def prompt_text(self, conversation: list[dict[str, str]]) -> str:
        if self.fail_on is not None and self.fail_on in conversation[-1]["content"]:
            raise ValueError("the template refuses this conversation")
        return self.scorer.prompt_text(conversation)

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        with self.lock:
            self.calls.append(len(prompts))
        return self.scorer.score(prompts, responses)


def comparisons(n: int) -> list[tuple[str, str, str]]:
    """n (prompt, response 1, response 2), each different."""
    return [(f"{PROMPT} {i}", CANDIDATES[i % 6], CANDIDATES[(i * 5 + 1) % 6]) for i in range(n)]


def post_together(url: str, triples: list[tuple[str, str, str]], structured: bool = True) -> list[httpx.Response]:
    """POST one chat completion per comparison, all at once (one thread each); the answers in order."""
    response_format = {"response_format": {"type": "json_object"}} if structured else {}
    bodies = [
        {"model": "tiny-judge", "messages": judge_messages([{"role": "user", "content": p}], a, b, None)}
        | response_format
        for p, a, b in triples
    ]
    with httpx.Client(timeout=30) as http, ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: http.post(f"{url}/chat/completions", json=body), bodies))


def test_concurrent_comparisons_share_forward_passes_and_get_their_one_at_a_time_answers(scorer: RewardScorer):
    counting = CountingScorer(scorer)
    triples = comparisons(12)
    # a long wait: every comparison sent together lands in the first batch or two, however loaded the machine
    with serving(create_app(counting, max_batch=64, max_wait_ms=500), path="/v1") as url:
        answers = post_together(url, triples)
        health = httpx.get(url.removesuffix("/v1") + "/health").json()
    assert [a.status_code for a in answers] == [200] * 12
    assert len(counting.calls) < 12 and sum(counting.calls) == 24  # two rows a comparison, fewer calls than requests
    assert health["requests"] == 12 and health["batches"] == len(counting.calls) and health["queue"] == 0
    for (prompt, first, second), answer in zip(triples, answers):  # in order: each answer is its own comparison's
        alone = judgement_from_rewards(*scorer.score([prompt, prompt], [first, second]))
        # the answer rounds to 3 decimals what a batch scores within float32 rounding of a lone pair's rewards
        assert json.loads(answer.json()["choices"][0]["message"]["content"]) == pytest.approx(alone, abs=1.5e-3)


def test_a_batch_holds_at_most_max_batch_comparisons(scorer: RewardScorer):
    counting = CountingScorer(scorer)
    with serving(create_app(counting, max_batch=3, max_wait_ms=200), path="/v1") as url:
        answers = post_together(url, comparisons(7))
    assert [a.status_code for a in answers] == [200] * 7
    assert max(counting.calls) <= 6 and sum(counting.calls) == 14 and len(counting.calls) >= 3


def test_batched_rewards_equal_the_rewards_scored_alone(scorer: RewardScorer):
    """In the scoring thread: one call for the batch, each comparison's pair as scoring it alone gives (within
    float32 rounding: a matrix product's sums may run in another order for another number of rows), in order."""
    counting = CountingScorer(scorer)
    requests = [JudgeRequest([{"role": "user", "content": p}], a, b) for p, a, b in comparisons(9)]
    batched = JudgeBatcher(counting)._score(requests)
    assert counting.calls == [18]
    for request, pair in zip(requests, batched):
        alone = scorer.score([request.conversation[0]["content"]] * 2, [request.response_1, request.response_2])
        assert list(pair) == pytest.approx(alone, rel=1e-5, abs=1e-6)


def test_a_response_in_several_comparisons_is_scored_once_and_remembered(scorer: RewardScorer):
    counting = CountingScorer(scorer)
    group = CANDIDATES[:4]
    requests = [JudgeRequest(CONVERSATION, group[i], group[j]) for i, j in comparison_pairs(4, "circular")]
    batcher = JudgeBatcher(counting, remembered=6)
    batched = batcher._score(requests)
    assert counting.calls == [4]  # 4 comparisons, 8 places, 4 responses
    alone = scorer.score([PROMPT] * 4, group)
    for (i, j), pair in zip(comparison_pairs(4, "circular"), batched):
        assert list(pair) == pytest.approx([alone[i], alone[j]], rel=1e-5, abs=1e-6)
    assert batcher._score(requests[:2]) == batched[:2] and counting.calls == [4]  # remembered: not scored again
    batcher._score([JudgeRequest(CONVERSATION, CANDIDATES[4], CANDIDATES[5])])
    assert counting.calls == [4, 2] and len(batcher.rewards) == 6
    batcher._score([JudgeRequest(CONVERSATION, " new one", CANDIDATES[5])])  # the least recently asked goes
    assert len(batcher.rewards) == 6 and (PROMPT, group[3]) not in batcher.rewards


def test_a_conversation_the_scorer_cannot_read_fails_alone(scorer: RewardScorer):
    counting = CountingScorer(scorer, fail_on="refuse me")
    triples = comparisons(4)
    triples[1] = ("refuse me", " cat", " dog")
    with serving(create_app(counting, max_wait_ms=300), path="/v1") as url:
        answers = post_together(url, triples, structured=False)
    assert [a.status_code for a in answers] == [200, 500, 200, 200]
    assert "the template refuses" in answers[1].json()["error"]["message"]
    assert parse_judgement(answers[0].json()["choices"][0]["message"]["content"])  # a fenced block without structure


def test_a_full_queue_answers_503_with_retry_after(scorer: RewardScorer):
    class SlowScorer(CountingScorer):
        def score(self, prompts: list[str], responses: list[str]) -> list[float]:
            time.sleep(1.0)
            return super().score(prompts, responses)

    with serving(create_app(SlowScorer(scorer), max_batch=1, max_wait_ms=0, max_queue=1), path="/v1") as url:
        answers = post_together(url, comparisons(4))
        health = httpx.get(url.removesuffix("/v1") + "/health").json()
    refused = [a for a in answers if a.status_code == 503]
    assert refused and all(a.headers["Retry-After"] == "1" for a in refused)
    assert "busy" in refused[0].json()["error"]["message"] and health["rejected"] == len(refused)
    assert all(a.status_code in (200, 503) for a in answers)


def test_batching_options_are_checked():
    with pytest.raises(ValueError, match="max_batch >= 1"):
        create_app(CountingScorer(None), max_batch=0)
