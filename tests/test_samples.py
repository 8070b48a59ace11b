"""Rollout samples on record: which rows, which fields, and the line the terminal shows."""

import json

import torch

from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.records.samples import SampleLog, describe_sample, sample_records
from rlsteps.engine.rewards.scores import Scores


def _batch() -> RolloutBatch:
    return RolloutBatch(
        tokens=torch.ones(3, 4, dtype=torch.long),
        prompt_lengths=torch.ones(3, dtype=torch.long),
        response_lengths=torch.full((3,), 3),
        is_end=torch.tensor([True, False, True]),
        prompt_ids=["a", "a", "b"],
        prompt_texts=["<s>[user] Hi\n[assistant]"] * 3,
        response_texts=["Hello!", "Hel", "Hey\nthere"],
        pad_id=0,
        conversations=[[{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]] * 3,
    )


def test_records_of_the_first_rows_with_the_reward_source_details_and_extra_rewards(tmp_path):
    scores = Scores(torch.tensor([2.5, 3.0, 1.0]), torch.tensor([True, False, True]), details=[{"judge": [1]}] * 3)
    records = sample_records(7, "train", _batch(), scores, count=2, extra={"val/true": [1.0, 0.0, 0.5]})
    assert records == [
        {
            "step": 7, "split": "train", "prompt_id": "a",
            "prompt": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}],
            "response": "Hello!", "reward": 2.5, "valid": True, "ended": True, "val/true": 1.0, "judge": [1],
        },
        {
            "step": 7, "split": "train", "prompt_id": "a",
            "prompt": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}],
            "response": "Hel", "reward": 3.0, "valid": False, "ended": False, "val/true": 0.0, "judge": [1],
        },
    ]  # fmt: skip
    assert describe_sample(records[0]) == "a: 'Hi' -> 'Hello!'  reward 2.5"
    assert describe_sample(records[1]) == "a: 'Hi' -> 'Hel' (cut off)  reward none (no valid judgement)"
    unchanged = {**records[1], "same_as_reference": True}  # greedy validation: the initial answer, not judged
    assert describe_sample(unchanged).endswith("reward none (the initial policy's answer again: not judged)")
    with SampleLog(tmp_path / "samples.jsonl") as log:
        log.write(records)
    (tmp_path / "samples.jsonl").open("a").write('{"step": 8, "spl')  # a crash mid-line
    with SampleLog(tmp_path / "samples.jsonl") as log:  # the next run drops the partial line and appends
        log.write(records[:1])
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert [json.loads(line)["response"] for line in lines] == ["Hello!", "Hel", "Hello!"]
