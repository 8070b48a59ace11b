"""Rollout samples a person can read: what the policy said, what it scored, and what a judge answered.

Every step appends a few records to <run>/samples.jsonl, one JSON object per line:
    {"step", "split": "train" | "val", "prompt_id", "prompt": [chat messages], "response", "reward",
     "valid", "ended", "judge": [{"pair", "answer", "outcome", "error"}] (judges only), "same_as_reference"
     (greedy validation's judge: the initial answer again, not judged), "val/<fn>": ...}
Validation also shows a couple of samples on the terminal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.records.metrics import append_whole, drop_partial_last_line, open_records
from rlsteps.engine.rewards.scores import Scores


def sample_records(
    step: int, split: str, batch: RolloutBatch, scores: Scores, count: int, extra: dict[str, list[float]] | None = None
) -> list[dict]:
    """Records of the first `count` rows (whole groups first: rollouts of a prompt are adjacent)."""
    records = []
    for row in range(min(count, len(batch))):
        record = {
            "step": step,
            "split": split,
            "prompt_id": batch.prompt_ids[row],
            "prompt": batch.conversation(row),
            "response": batch.response_texts[row],
            "reward": round(float(scores.rewards[row]), 6),
            "valid": bool(scores.valid[row]),
            "ended": bool(batch.is_end[row]),
        }
        record.update({name: values[row] for name, values in (extra or {}).items()})
        if scores.details is not None:
            record.update(scores.details[row])
        records.append(record)
    return records


def describe_sample(record: dict, width: int = 160) -> str:
    """One line for the terminal: the last user message, the response and its reward."""
    users = [m["content"] for m in record["prompt"] if m["role"] == "user"]
    prompt = (users[-1] if users else record["prompt"][-1]["content"]).replace("\n", " ")
    response = record["response"].replace("\n", " ")
    ended = "" if record["ended"] else " (cut off)"
    reward = f"{record['reward']:.3g}" if record["valid"] else f"none ({_why_no_reward(record)})"
    line = f"{record['prompt_id']}: {prompt!r} -> {response!r}{ended}  reward {reward}"
    return line if len(line) <= width else line[: width - 3] + "..."


def _why_no_reward(record: dict) -> str:
    if record.get("same_as_reference"):  # greedy validation's judge meets the initial policy's answers
        return "the initial policy's answer again: not judged"
    return "no valid judgement"


class SampleLog:
    """Appends sample records to a JSONL file, written at once and whole: a write the disk cannot take is cut back
    (a kill mid-write may leave a torn line, which the next start drops)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        drop_partial_last_line(self.path)
        self._file: BinaryIO = open_records(self.path)

    def write(self, records: list[dict]) -> None:
        append_whole(self._file, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SampleLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def show_samples(records: list[dict], say: Callable[[str], None]) -> None:
    for record in records:
        say(f"sample {describe_sample(record)}")
