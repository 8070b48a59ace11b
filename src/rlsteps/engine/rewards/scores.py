"""What every reward source gives back and how the loop asks it: the vocabulary of rewards.sources and of each source
(the judge's, a reward model's, a function's), kept apart from the sources so each can import it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from rlsteps.engine.batch import RolloutBatch


@dataclass
class Scores:
    rewards: torch.Tensor  # [B] float
    valid: torch.Tensor  # [B] bool
    metrics: dict[str, float] = field(default_factory=dict)
    details: list[dict] | None = None  # [B] what a sample record shows beside the reward (a judge's answers)

    def select(self, rows: list[int]) -> Scores:
        """The scores of the given rows (the batch's metrics stay whole)."""
        return Scores(
            rewards=self.rewards[rows],
            valid=self.valid[rows],
            metrics=self.metrics,
            details=None if self.details is None else [self.details[i] for i in rows],
        )


class RewardSource(Protocol):
    def score(self, batch: RolloutBatch) -> Scores: ...

    def score_alone(self, batch: RolloutBatch) -> Scores:
        """Scores of one response per prompt (greedy validation)."""
        ...


def nothing_to_wait_for() -> None:
    return None
