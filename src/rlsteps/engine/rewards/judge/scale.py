"""How the tiny judge server reads a scalar reward as a 1-5 score: score = 1 + 4 sigmoid((reward - center) / scale).

A reward model's rewards have no fixed range: the tiny world's span about -50 to 55, and one world's whole spread sits
20 higher than another's. Read with a fixed center 0 and scale 2, every answer above about 12 scored 5.000, so a
group's well-formed answers and its answers without their noun and verb ("The delightful, elegant, gentle and kind.")
came back alike as 5.0 and GRPO raised both. The scale that fits a reward model is the spread of its own rewards:
`reward_scale_of` reads it from the model's config.json (JUDGE_SCALE_KEY: {"center": mean, "scale": std}, which the
tiny world's build writes, measured on answers of the task); a model without it is read with DEFAULT_SCALE.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

JUDGE_SCALE_KEY = "rlsteps_judge_scale"


@dataclass(frozen=True)
class RewardScale:
    center: float = 0.0
    scale: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.center) and math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"a judge's reward scale needs a finite center and a scale > 0, got {self}")

    def score(self, reward: float) -> float:
        """The 1-5 score of a reward."""
        return 1 + 4 * _sigmoid((reward - self.center) / self.scale)

    def first_better(self, reward_1: float, reward_2: float) -> float:
        """How likely the first response is the better one."""
        return _sigmoid((reward_1 - reward_2) / self.scale)


DEFAULT_SCALE = RewardScale()


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(min(x, 50.0), -50.0)))


def reward_scale_of(model_path: str | Path) -> RewardScale:
    """The reward model's own scale (its config.json's JUDGE_SCALE_KEY), or DEFAULT_SCALE where it has none; a
    ValueError naming the file where the entry is not {"center": number, "scale": number > 0}."""
    config = Path(model_path) / "config.json"
    entry = json.loads(config.read_text()).get(JUDGE_SCALE_KEY)
    if entry is None:
        return DEFAULT_SCALE
    try:
        return RewardScale(float(entry["center"]), float(entry["scale"]))
    except (TypeError, KeyError, ValueError) as error:
        raise ValueError(
            f'{config}: {JUDGE_SCALE_KEY} must be {{"center": number, "scale": number > 0}}, got {entry!r} ({error})'
        ) from None
