"""Dynamic sampling (DAPO): which prompt groups a step trains on, as NeMo-RL v0.7.0's grpo.use_dynamic_sampling
fills its batch (nemo_rl/algorithms/grpo.py: dynamic_sampling and its batch_cache).

A step draws generation batches of prompts_per_step prompts, each the next prompts of the data order, until it holds
prompts_per_step groups whose rewards differ. Each generation batch's such groups are kept, in prompt order, after
those of the batches before; the first prompts_per_step of them train and the surplus is dropped (NeMo-RL's
dynamic_sampling_num_discarded_valid_samples): nothing is carried over to the next step, which draws the prompts
after the last generation batch's. NeMo-RL draws another batch while the count of batches drawn is at most
grpo.dynamic_sampling_max_gen_batches, so a step draws up to that bound plus one, and a batch still short then stops
the run with an error naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_GEN_BATCHES_KEY = "grpo.dynamic_sampling_max_gen_batches"

Group = tuple[int, int]  # (generation batch, prompt position in it)


class DynamicSamplingExhausted(RuntimeError):
    """The step's generation batches ran past the bound with fewer groups whose rewards differ than it trains on;
    `fix` says what to change."""

    fix = (
        f"raise {MAX_GEN_BATCHES_KEY}, draw more rollouts per prompt (rollout.num_rollouts_per_prompt) or use prompts "
        "whose rewards vary more, then rerun"
    )


@dataclass
class KeptGroups:
    """The groups a step keeps across its generation batches (NeMo-RL's batch_cache), in the order they were kept."""

    needed: int  # groups a step trains on: rollout.prompts_per_step
    max_gen_batches: int  # grpo.dynamic_sampling_max_gen_batches
    kept: list[Group] = field(default_factory=list)
    generation_batches: int = 0
    drawn: int = 0  # groups drawn, kept or not

    def add(self, flat: list[bool]) -> None:
        """One generation batch's groups in prompt order, True where its rewards do not differ (dropped)."""
        self.kept.extend((self.generation_batches, j) for j, dropped in enumerate(flat) if not dropped)
        self.generation_batches += 1
        self.drawn += len(flat)
        if not self.full and self.generation_batches > self.max_gen_batches:
            raise DynamicSamplingExhausted(
                f"grpo.dynamic_sampling: after {self.generation_batches} generation batches ({self.drawn} prompt "
                f"groups) only {len(self.kept)} had rewards that differ, of the {self.needed} a step trains on "
                f"({MAX_GEN_BATCHES_KEY}={self.max_gen_batches})"
            )

    @property
    def full(self) -> bool:
        return len(self.kept) >= self.needed

    def chosen(self) -> list[Group]:
        """The groups that train, in order: the first `needed` kept."""
        return self.kept[: self.needed]

    def stats(self) -> dict[str, float]:
        return {
            "train/dynamic_sampling_gen_batches": float(self.generation_batches),
            "train/dynamic_sampling_discarded_groups": float(max(len(self.kept) - self.needed, 0)),
            "train/fraction_dropped_zero_variance": 1.0 - len(self.kept) / max(self.drawn, 1),
        }
