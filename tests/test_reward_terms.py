"""Rewards as the config composes them: Python functions in process, a weighted sum of terms each logged on its own,
transport failures that are seen, and inputs required only by the terms that use them."""

from __future__ import annotations

import logging
import math
import re
import time

import pytest
import torch
from pydantic import ValidationError

from rlsteps.contract.config import RSConfig
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.rewards.combined import CombinedSource, RewardTerm
from rlsteps.engine.rewards.functions import FunctionScorer, RewardFunctionError, RewardFunctionFailed
from rlsteps.engine.rewards.judge.client import JudgeAnswer, JudgeResult, JudgeUnavailable
from rlsteps.engine.rewards.judge.source import JudgeSource
from rlsteps.engine.rewards.sources import FunctionSource

HERE = "test_reward_terms"


def qa_batch(responses: list[str], answers: list[str | None]) -> RolloutBatch:
    """One row per response; row i answers prompt "q<i // 2>" (groups of two), with the line's field "answer"."""
    n = len(responses)
    return RolloutBatch(
        tokens=torch.ones(n, 3, dtype=torch.long),
        prompt_lengths=torch.ones(n, dtype=torch.long),
        response_lengths=torch.tensor([len(r.split()) + 1 for r in responses]),
        is_end=torch.ones(n, dtype=torch.bool),
        prompt_ids=[f"q{i // 2}" for i in range(n)],
        prompt_texts=[f"<user> Q{i // 2}? <assistant>" for i in range(n)],
        response_texts=responses,
        pad_id=0,
        conversations=[[{"role": "user", "content": f"Q{i // 2}?"}] for i in range(n)],
        fields=[{} if a is None else {"answer": a, "source": "atlas"} for a in answers],
    )


# reward functions of the protocol, found by the scorer through "tests' module:name"
def exact(messages, response, answer=None):
    return None if answer is None else float(response.strip(". ").lower() == answer.lower())


def length_in_words(messages, response):  # takes no field: it gets none
    return float(len(response.split()))


def all_fields(messages, response, **fields):
    return float(len(fields))


def batched_exact(messages, responses, answer):
    return [float(r.strip(". ").lower() == (a or "").lower()) for r, a in zip(responses, answer)]


def nan_on_paris(messages, response):
    return math.nan if "Paris" in response else 1.0


def raises_on_rome(messages, response):
    if "Rome" in response:
        raise KeyError("rome")
    return 0.0


def says_yes(messages, response):
    return "yes"


def short_list(messages, responses):
    return [1.0]


def slow(messages, response):
    time.sleep(2)
    return 1.0


def scorer(name: str, **options) -> FunctionScorer:
    return FunctionScorer.load(name, f"{HERE}:{name}", **options)


def test_a_function_gets_the_messages_the_response_and_the_fields_it_names():
    batch = qa_batch(["Paris.", "paris is nice", "Rome", "Berlin"], ["Paris", "Paris", "Rome", None])
    assert scorer("exact")(batch) == [1.0, 0.0, 1.0, None]  # None: no reward for a line without an answer
    assert scorer("length_in_words")(batch) == [1.0, 3.0, 1.0, 1.0]
    assert scorer("all_fields")(batch) == [2.0, 2.0, 2.0, 0.0]  # **fields: every key of the line but its prompt
    assert scorer("batched_exact", batched=True)(batch) == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("name", "options", "said"),
    [
        ("nan_on_paris", {}, "on sample 0 (prompt 'q0', response 'Paris.') returned nan: return a finite float"),
        ("raises_on_rome", {}, "on sample 2 (prompt 'q1', response 'Rome') raised KeyError: 'rome'"),
        ("says_yes", {}, "returned 'yes': return a float or None"),
        ("short_list", {"batched": True}, "is batched and returned 1 values for 4 samples"),
        ("slow", {"timeout_s": 0.2}, "took more than 0.2 s over 4 samples; make it faster or raise its timeout_s"),
    ],
)
def test_a_function_that_fails_is_named_with_the_sample(name, options, said):
    batch = qa_batch(["Paris.", "paris is nice", "Rome", "Berlin"], ["Paris", "Paris", "Rome", None])
    with pytest.raises(RewardFunctionFailed) as failed:
        scorer(name, **options)(batch)
    assert f"reward function {name} ({HERE}:{name})" in str(failed.value) and said in str(failed.value)


def test_a_function_that_cannot_be_loaded_says_why():
    with pytest.raises(RewardFunctionError, match="cannot import no_such_module"):
        FunctionScorer.load("x", "no_such_module:f")
    with pytest.raises(RewardFunctionError, match="has no callable 'missing'"):
        FunctionScorer.load("x", f"{HERE}:missing")


def test_the_reward_is_the_weighted_sum_and_a_row_any_term_cannot_score_leaves_the_loss():
    batch = qa_batch(["Paris.", "paris is nice", "Rome", "Berlin"], ["Paris", "Paris", "Rome", None])
    combined = CombinedSource(
        [
            RewardTerm("correct", 1.0, FunctionSource(scorer("exact"))),
            RewardTerm("length", -0.5, FunctionSource(scorer("length_in_words"))),
        ]
    )
    scores = combined.score(batch)
    # by hand: 1 - 0.5*1, 0 - 0.5*3, 1 - 0.5*1, and row 3 has no correctness reward
    assert scores.rewards[:3].tolist() == [0.5, -1.5, 0.5] and scores.valid.tolist() == [True, True, True, False]
    assert scores.metrics["reward/correct"] == pytest.approx(2 / 3)  # over the rows the term scored
    assert scores.metrics["reward/length"] == pytest.approx(6 / 4)
    assert scores.details[1]["rewards"] == {"correct": 0.0, "length": 3.0}
    assert scores.details[3]["rewards"] == {"correct": None, "length": 1.0}


def test_a_term_is_clipped_then_scaled_before_its_weight_and_logged_before_and_after():
    batch = qa_batch(["one", "two words here", "four words are here", "x"], [None] * 4)  # lengths 1, 3, 4, 1
    length = FunctionSource(scorer("length_in_words"))
    alone = CombinedSource([RewardTerm("length", 1.0, length, clip=(0.0, 2.0), scale=0.5)]).score(batch)
    assert alone.rewards.tolist() == [0.5, 1.0, 1.0, 0.5]  # min(len, 2) / 2
    assert alone.metrics["reward/length"] == pytest.approx(9 / 4)  # raw
    assert alone.metrics["reward/length/shaped"] == pytest.approx(3 / 4)
    assert alone.metrics["reward/length/clipped"] == pytest.approx(2 / 4)  # the rows of 3 and 4 words
    assert alone.details[2]["rewards"] == {"length": 4.0}  # a sample's record shows the raw reward
    summed = CombinedSource(
        [
            RewardTerm("length", -2.0, length, clip=(1.5, 3.0)),
            RewardTerm("count", 1.0, FunctionSource(scorer("all_fields")), scale=3.0),
        ]
    ).score(batch)
    assert summed.rewards.tolist() == [-3.0, -6.0, -6.0, -3.0]  # -2 * clip(len, 1.5, 3) + 3 * 0
    assert "reward/count/clipped" not in summed.metrics and summed.metrics["reward/count/shaped"] == 0.0
    unshaped = CombinedSource([RewardTerm("length", 1.0, length)]).score(batch)
    assert unshaped.rewards.tolist() == [1.0, 3.0, 4.0, 1.0] and "reward/length/shaped" not in unshaped.metrics


@pytest.mark.parametrize(
    "entry, said",
    [
        ({"clip": [2.0, 1.0]}, "rewards.reward_model.clip [2.0, 1.0]: give [low, high] with low < high, both finite"),
        ({"clip": [0.0, float("inf")]}, "rewards.reward_model.clip [0.0, inf]: give [low, high]"),
        ({"clip": [0.0]}, "clip"),
        ({"scale": 0.0}, "greater than 0"),
    ],
)
def test_a_clip_or_scale_that_cannot_hold_is_refused(entry, said):
    with pytest.raises(ValidationError, match=re.escape(said)):
        RSConfig.model_validate(
            {
                "algorithm": "rs",
                "rollout": {"top_n_rollouts": 1},
                "inputs": {"prompts": "p.jsonl", "policy": "p"},
                "output": {"dir": "out"},
                "rewards": {"reward_model": {"source": "reward_model", **entry}},
            }
        )


class FailingJudge:
    """One comparison per group of two; `transport` of them failed in transport."""

    def __init__(self, groups: int, transport: int) -> None:
        self.groups, self.transport = groups, transport

    def judge(self, requests):
        failed = [g < self.transport for g in range(len(requests))]
        answers = [
            JudgeAnswer(g, (0, 1), None if f else "{}", "transport" if f else None, "connection refused" if f else "")
            for g, f in enumerate(failed)
        ]
        stats = {"comparisons": float(len(requests)), "parse_failures": 0.0, "transport_failures": float(sum(failed))}
        return JudgeResult([[5.0, 3.0]] * len(requests), [[not f, not f] for f in failed], stats, answers)


def test_a_few_transport_failures_warn_with_the_count_and_more_than_the_limit_stop(caplog):
    batch = qa_batch([f"r{i}" for i in range(20)], [None] * 20)  # 10 groups of two, 10 comparisons
    source = JudgeSource(FailingJudge(10, 1), max_failure_rate=0.1)
    with caplog.at_level(logging.WARNING):
        scores = source.score(batch)
    assert "1 of 10 judge comparisons failed in transport" in caplog.text
    assert scores.valid.tolist() == [False, False] + [True] * 18
    with pytest.raises(JudgeUnavailable, match=r"2 of 10 judge comparisons failed in transport, more than judge\."):
        JudgeSource(FailingJudge(10, 2), max_failure_rate=0.1).score(batch)
    assert source.transport_failures == 1  # counted over the run, for its end summary


class PositionJudge:
    """Scores the first response of each pair 6 and the second 4 (as a judge with a position bias would)."""

    def __init__(self) -> None:
        self.requests = []

    def judge(self, requests):
        self.requests += requests
        answers = [JudgeAnswer(g, (0, 1), "{}", None) for g in range(len(requests))]
        stats = {"comparisons": float(len(requests)), "parse_failures": 0.0, "transport_failures": 0.0}
        return JudgeResult([[6.0, 4.0]] * len(requests), [[True, True]] * len(requests), stats, answers)


def test_greedy_validation_meets_the_first_validations_responses_and_never_itself(tmp_path):
    """The first validation's responses (the initial policy's) are the references; a response identical to its
    reference is not shown to the judge (a judge shown one text twice answers by position alone): no judge figure."""
    judge = PositionJudge()
    source = JudgeSource(judge, reference_path=tmp_path / "refs.json")
    first = qa_batch(["a0", "b0"], [None, None])
    first.prompt_ids = ["p", "q"]
    scores = source.score_alone(first)
    assert judge.requests == []  # each would meet itself
    assert scores.valid.tolist() == [False, False]
    assert scores.details == [{"judge": [], "same_as_reference": True}] * 2  # what the sample records say
    later = qa_batch(["a1", "b0"], [None, None])
    later.prompt_ids = ["p", "q"]
    scores = JudgeSource(judge, reference_path=tmp_path / "refs.json").score_alone(later)  # a resumed run reads it
    assert [r for _, r in judge.requests] == [["a1", "a0"]]  # b0 is still the reference's text
    assert scores.rewards[0] == 6.0 and scores.valid.tolist() == [True, False]
    assert "same_as_reference" not in scores.details[0] and scores.details[1]["same_as_reference"]


def rs_config(**rewards) -> dict:
    return {
        "algorithm": "rs",
        "inputs": {"prompts": "p.jsonl", "policy": "policy"},
        "output": {"dir": "out"},
        "rollout": {"top_n_rollouts": 1, "num_rollouts_per_prompt": 4},
        "rewards": rewards,
    }


def test_rewards_entries_are_checked_when_the_config_is():
    cfg = RSConfig.model_validate(
        rs_config(reward_model=None, correct={"function": f"{HERE}:exact"}, judge={"source": "judge", "weight": 0.5})
    )
    assert list(cfg.reward_terms) == ["correct", "judge"] and cfg.uses_reward("judge")
    assert not cfg.uses_reward("reward_model")
    refusals = {
        "no entry": rs_config(reward_model=None),
        "exactly one of source": rs_config(x={"source": "judge", "function": f"{HERE}:exact"}),
        "all use the judge": rs_config(a={"source": "judge"}, b={"source": "judge"}),
        "must read 'package.module:function'": rs_config(x={"function": "exact"}),
        "letters, digits and _": rs_config(**{"a/b": {"source": "judge"}}),
    }
    for said, config in refusals.items():
        with pytest.raises(ValidationError, match=said):
            RSConfig.model_validate(config)
    alone = rs_config(j={"source": "judge"})
    alone["rollout"]["num_rollouts_per_prompt"] = 1
    with pytest.raises(ValidationError, match="num_rollouts_per_prompt must be 2 or more"):
        RSConfig.model_validate(alone)
