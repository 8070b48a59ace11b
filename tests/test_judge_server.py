"""The tiny judge server: a reward model behind an OpenAI-compatible chat API, on a loopback socket."""

from __future__ import annotations

import math

import httpx
import pytest

from model_fixtures import save_reward_model, serving
from rlsteps.engine.rewards.judge.client import JudgeClient
from rlsteps.engine.rewards.judge.parsing import parse_judgement
from rlsteps.engine.rewards.judge.protocol import judge_messages
from rlsteps.engine.rewards.judge.server import create_app, judgement_from_rewards
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
    assert judgement_from_rewards(0.7, 0.7, center=0.7, scale=1.0) == {"score_1": 3.0, "score_2": 3.0, "ranking": 3.5}
    # sigmoid(ln 3) = 0.75: score_1 = 1 + 4 * 0.75 = 4; p = 0.75 -> ranking = 1 + 5 * 0.25 = 2.25
    assert judgement_from_rewards(2 * math.log(3), 0.0) == {"score_1": 4.0, "score_2": 3.0, "ranking": 2.25}
    # a difference of ln 3 makes p = 3/4
    assert judgement_from_rewards(-1e6, 1e6) == {"score_1": 1.0, "score_2": 5.0, "ranking": 6.0}


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


def test_unreadable_requests_get_400_with_the_reason(scorer: RewardScorer):
    with serving(create_app(scorer), path="/v1") as url:
        not_json = httpx.post(f"{url}/chat/completions", content=b"{oops", headers={"Content-Type": "application/json"})
        no_messages = httpx.post(f"{url}/chat/completions", json={"model": "tiny-judge"})
        free_text = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]
    assert no_messages.status_code == 400 and "'messages'" in no_messages.json()["error"]["message"]
    assert free_text.status_code == 400 and "[RESPONSE 1]" in free_text.json()["error"]["message"]


def test_token_is_required_when_set(scorer: RewardScorer):
    body = {"model": "tiny-judge", "messages": judge_messages(CONVERSATION, " cat", " dog", None)}
    with serving(create_app(scorer, token="s3cret"), path="/v1") as url:
        refused = httpx.post(f"{url}/chat/completions", json=body)
        wrong = httpx.post(f"{url}/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        with JudgeClient(url, "tiny-judge", api_key="s3cret") as client:
            result = client.judge([(CONVERSATION, [" cat", " dog"])])
    assert refused.status_code == 401 and wrong.status_code == 401
    assert result.valid == [[True, True]]
