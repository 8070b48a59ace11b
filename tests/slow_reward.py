"""A batched reward function that makes chosen training steps long, for the tests that interrupt a step.

SLOW_REWARD_DIR: where it counts its training calls (one per step; a validation's are not counted) and writes
`ready` when a slow one starts; SLOW_REWARD_CALLS: the counted calls that sleep SLOW_REWARD_S seconds (e.g. "2,4").
The count runs on across runs in the same directory, so a rerun's steps are numbered after the first run's.
"""

import os
import time
from pathlib import Path

TRAINING_ROWS_AT_LEAST = 64  # a training step's rows (16 prompts x 8 rollouts); a validation's are fewer


def slow(messages, response, **fields) -> list[float]:
    if len(response) >= TRAINING_ROWS_AT_LEAST:
        here = Path(os.environ["SLOW_REWARD_DIR"])
        count_file = here / "calls"
        count = int(count_file.read_text()) + 1 if count_file.is_file() else 1
        count_file.write_text(str(count))
        if str(count) in os.environ.get("SLOW_REWARD_CALLS", "").split(","):
            (here / "ready").write_text(str(count))
            time.sleep(float(os.environ.get("SLOW_REWARD_S", "4")))
    return [0.0] * len(response)
