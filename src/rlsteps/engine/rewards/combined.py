"""A step's reward: the config's `rewards:` terms, each clipped and scaled as its entry says, summed with weights.

Each term's raw mean over the rows it scored is logged as reward/<name>. A term with `clip: [low, high]` or a `scale`
holds each reward within [low, high] and multiplies it by the scale before the weight sums the terms; the mean after
is logged as reward/<name>/shaped, and the share of its rows the clip moved as reward/<name>/clipped. What a term
pays between the answers of one prompt, which is what moves their advantages, is logged as reward/<name>/spread
(term_spread). A row any term could not score leaves the loss.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlsteps.contract.config import RecipeConfig
from rlsteps.engine.rewards.scores import RewardSource, Scores
from rlsteps.engine.rewards.sources import term_source

if TYPE_CHECKING:
    import torch

    from rlsteps.engine.batch import RolloutBatch


@dataclass
class RewardTerm:
    name: str
    weight: float
    source: RewardSource
    clip: tuple[float, float] | None = None  # each reward held within [low, high], then times scale
    scale: float = 1.0

    @property
    def shaped(self) -> bool:
        return self.clip is not None or self.scale != 1.0

    def shape(self, rewards: torch.Tensor) -> torch.Tensor:
        """The rewards [B] clipped, then scaled."""
        held = rewards if self.clip is None else rewards.clamp(*self.clip)
        return held * self.scale


class CombinedSource:
    """The config's rewards: every term scores the batch, a row's reward is the weighted sum of the terms' shaped
    rewards, and a row any term could not score leaves the loss."""

    def __init__(self, terms: list[RewardTerm]) -> None:
        self.terms = terms

    @property
    def transport_failures(self) -> int:
        return sum(getattr(term.source, "transport_failures", 0) for term in self.terms)

    def score(self, batch: RolloutBatch) -> Scores:
        return self._combined(batch, [term.source.score(batch) for term in self.terms])

    def score_alone(self, batch: RolloutBatch) -> Scores:
        return self._combined(batch, [term.source.score_alone(batch) for term in self.terms])

    def _combined(self, batch: RolloutBatch, parts: list[Scores]) -> Scores:
        import torch

        metrics = {key: value for part in parts for key, value in part.metrics.items()}
        metrics.update(term_metrics(self.terms, parts, batch))
        only = self.terms[0]
        if len(parts) == 1 and only.weight == 1.0 and not only.shaped:
            return dataclasses.replace(parts[0], metrics=metrics)
        rewards, valid = torch.zeros(len(batch)), torch.ones(len(batch), dtype=torch.bool)
        for term, part in zip(self.terms, parts):
            rewards += term.weight * term.shape(part.rewards)
            valid &= part.valid
        details = [
            {
                "rewards": {
                    term.name: round(float(part.rewards[i]), 6) if part.valid[i] else None
                    for term, part in zip(self.terms, parts)
                },
                **{k: v for part in parts if part.details for k, v in part.details[i].items()},
            }
            for i in range(len(batch))
        ]
        return Scores(rewards=rewards, valid=valid, metrics=metrics, details=details)


def term_metrics(terms: list[RewardTerm], parts: list[Scores], batch: RolloutBatch) -> dict[str, float]:
    """reward/<name>: each term's raw mean over the rows it scored; for a shaped term also reward/<name>/shaped, the
    mean after clip and scale, and reward/<name>/clipped, the share of those rows the clip moved; for every term
    reward/<name>/spread (term_spread of its shaped rewards over the rows the loss keeps), where a prompt has two."""
    import torch

    metrics = {}
    kept = torch.stack([part.valid for part in parts]).all(dim=0)  # the rows every term scored
    group_index, _ = batch.group_index()
    for term, part in zip(terms, parts):
        scored = part.rewards[part.valid]
        metrics[f"reward/{term.name}"] = _mean(scored)
        if term.shaped:
            metrics[f"reward/{term.name}/shaped"] = _mean(term.shape(scored))
        if term.clip is not None:
            moved = (scored < term.clip[0]) | (scored > term.clip[1])
            metrics[f"reward/{term.name}/clipped"] = _mean(moved.float())
        spread = term_spread(term.shape(part.rewards), group_index, kept)
        if spread is not None:
            metrics[f"reward/{term.name}/spread"] = spread
    return metrics


def term_spread(values: torch.Tensor, group_index: torch.Tensor, kept: torch.Tensor) -> float | None:
    """What a term pays between the answers of one prompt: the mean over prompts of the standard deviation (unbiased)
    of its values [B] among the prompt's kept rows, over the prompts with two or more; None where none has two (greedy
    validation answers each prompt once).

    An answer's advantage is its reward less the mean of its prompt's (over their standard deviation, in GRPO), so a
    term moves the policy by how much it differs between the answers of a prompt, not by its mean: a term that pays
    every answer alike, however much, moves nothing, and one whose mean shrinks as a hack succeeds (or that counts
    with a negative weight) can still pay the most between answers."""
    import torch

    from rlsteps.engine.algorithms.groups import group_std, number_of_groups

    values = torch.where(kept, values, torch.zeros_like(values))  # a row a term could not score may hold NaN
    groups = number_of_groups(group_index)
    stds = torch.zeros(groups, dtype=values.dtype).scatter(0, group_index, group_std(values, group_index, kept))
    rows = torch.zeros(groups).index_add(0, group_index, kept.float())
    spreads = stds[rows >= 2]
    return spreads.mean().item() if len(spreads) else None


def _mean(values: torch.Tensor) -> float:
    return values.mean().item() if len(values) else float("nan")


@contextlib.contextmanager
def open_reward_source(cfg: RecipeConfig, run_dir: Path) -> Iterator[CombinedSource]:
    """Every term of the config's rewards, served sources started (in the config's order) and stopped after."""
    with contextlib.ExitStack() as stack:
        terms = [
            RewardTerm(
                name,
                entry.weight,
                stack.enter_context(term_source(cfg, entry, name, run_dir)),
                clip=entry.clip,
                scale=entry.scale,
            )
            for name, entry in cfg.reward_terms.items()
        ]
        yield CombinedSource(terms)
