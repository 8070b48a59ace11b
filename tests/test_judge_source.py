"""The judge as a reward source: rewards per row, the judge's answers per row, and the parse-failure stop."""

import logging

import pytest
import torch

from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.records.metrics import MetricsWriter
from rlsteps.engine.records.run_end import summarise
from rlsteps.engine.rewards.judge.client import JudgeAnswer, JudgeAnswersUnusable, JudgeResult
from rlsteps.engine.rewards.judge.source import JudgeSource


def batch_of_two_groups() -> RolloutBatch:
    """Rows 0-1 answer prompt "a", rows 2-3 prompt "b"; the conversations are the prompts' own messages."""
    return RolloutBatch(
        tokens=torch.ones(4, 3, dtype=torch.long),
        prompt_lengths=torch.ones(4, dtype=torch.long),
        response_lengths=torch.full((4,), 2),
        is_end=torch.ones(4, dtype=torch.bool),
        prompt_ids=["a", "a", "b", "b"],
        prompt_texts=["<s>[user] A?[assistant]"] * 2 + ["<s>[user] B?[assistant]"] * 2,
        response_texts=["r0", "r1", "r2", "r3"],
        pad_id=0,
        conversations=[[{"role": "user", "content": "A?"}]] * 2 + [[{"role": "user", "content": "B?"}]] * 2,
    )


class CannedClient:
    """Answers each call with the given outcomes, one comparison (0, 1) per group; records what it was asked."""

    def __init__(self, failures: list[str | None]) -> None:
        self.failures, self.requests = failures, []

    def judge(self, groups):
        self.requests.append(groups)
        answers = [
            JudgeAnswer(g, (0, 1), "{}" if f is None else f"babble {g}", f, "" if f is None else f"no JSON {g}")
            for g, f in enumerate(self.failures)
        ]
        ok = [f is None for f in self.failures]
        rewards = [[4.0, 2.0] if good else [3.0, 3.0] for good in ok]
        stats = {"comparisons": 2.0, "parse_failures": float(sum(not good for good in ok)), "transport_failures": 0.0}
        return JudgeResult(rewards=rewards, valid=[[good, good] for good in ok], stats=stats, answers=answers)


def test_the_judge_gets_conversations_and_each_row_keeps_its_answers():
    client = CannedClient([None, "parse"])
    scores = JudgeSource(client).score(batch_of_two_groups())  # 1 of 2 unparsable: 50% is not over the 50% limit
    conversation, responses = client.requests[0][1]
    assert conversation == [{"role": "user", "content": "B?"}] and responses == ["r2", "r3"]  # no template markup
    assert scores.rewards.tolist() == [4.0, 2.0, 3.0, 3.0] and scores.valid.tolist() == [True, True, False, False]
    assert scores.details[0]["judge"] == [{"pair": [0, 1], "answer": "{}", "outcome": "ok", "error": ""}]
    assert scores.details[3]["judge"][0]["outcome"] == "parse" and scores.details[3]["judge"][0]["answer"] == "babble 1"


def test_too_many_unparsable_answers_stop_the_run_and_show_them():
    with pytest.raises(JudgeAnswersUnusable) as stopped:
        JudgeSource(CannedClient(["parse", "parse"])).score(batch_of_two_groups())
    message = str(stopped.value)
    assert "did not parse in 100% of 2 comparisons" in message and "max_parse_failure_rate=0.5" in message
    assert "no JSON 0" in message and "no JSON 1" in message and "judge.structured_output=json_schema" in message


def test_the_parse_failure_limit_is_configurable():
    with pytest.raises(JudgeAnswersUnusable, match="50% of 2"):
        JudgeSource(CannedClient([None, "parse"]), max_parse_failure_rate=0.0).score(batch_of_two_groups())
    JudgeSource(CannedClient(["parse", "parse"]), max_parse_failure_rate=1.0).score(batch_of_two_groups())


def summary_of(run_dir, first_position_rates, contradiction_rates, caplog) -> str:
    """The end summary's warnings of a run that logged these judge figures, one step each."""
    with MetricsWriter(run_dir / "metrics.jsonl") as metrics:
        for step, (first, contradicting) in enumerate(zip(first_position_rates, contradiction_rates), start=1):
            metrics.log(step, {"judge/first_position_rate": first, "judge/contradiction_rate": contradicting})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlsteps"):
        summarise(run_dir, [])
    return caplog.text


def test_the_end_summary_warns_when_the_judge_is_no_better_than_its_position(tmp_path, caplog):
    (tmp_path / "biased").mkdir()
    text = summary_of(tmp_path / "biased", [1.0, 0.875, 1.0], [0.5, 0.25, 0.5], caplog)
    assert "gave 96% of its verdicts over the run to the response shown first (judge/first_position_rate" in text
    assert "preferred different responses in 42% of its verdicts over the run (judge/contradiction_rate)" in text
    (tmp_path / "fair").mkdir()
    assert summary_of(tmp_path / "fair", [0.5, 0.625, 0.4], [0.0, 0.1, 0.0], caplog) == ""  # 0.51 over the run
    (tmp_path / "second").mkdir()  # a judge that favours the second position is as blind
    assert "gave 33% of its verdicts" in summary_of(tmp_path / "second", [0.375, 0.25, 0.375], [0.0] * 3, caplog)
