"""The rows a GRPO step makes and how NeMo-RL's policy splits them: the arithmetic NeMo-RL's own code asserts at the
first step, checked when a job is compiled, with a fix that passes it; pure.

A step makes rows = grpo.num_prompts_per_step x grpo.num_generations_per_prompt. NeMo-RL v0.7.0 then asserts:
- Policy.train -> BatchedDataDict.shard_by_batch_size(data_parallel, batch_size=policy.train_global_batch_size):
  rows a multiple of the global batch, and the global batch a multiple of the data-parallel size;
- Policy.get_logprobs (and the reference policy's) -> shard_by_batch_size(data_parallel): rows a multiple of the
  data-parallel size;
- without sequence packing or dynamic batching, each rank's part is cut by make_microbatch_iterator: the global
  batch's share a multiple of policy.train_micro_batch_size, the step's share a multiple of
  policy.logprob_batch_size.
The data-parallel size is the policy's GPUs over its model parallelism (tensor x pipeline x context).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

PROMPTS = "grpo.num_prompts_per_step"
GENERATIONS = "grpo.num_generations_per_prompt"
GLOBAL_BATCH = "policy.train_global_batch_size"
MICRO_BATCH = "policy.train_micro_batch_size"
LOGPROB_BATCH = "policy.logprob_batch_size"


@dataclass(frozen=True)
class Split:
    prompts: int
    generations: int
    global_batch: int
    data_parallel: int
    micro_batch: int | None  # None: sequence packing or dynamic batching cut the micro-batches by tokens
    logprob_batch: int | None

    @property
    def rows(self) -> int:
        return self.prompts * self.generations

    def problems(self) -> list[str]:
        """NeMo-RL's own assertions that this split fails, in its words, with the numbers."""
        rows, batch, dp = self.rows, self.global_batch, self.data_parallel
        found = []
        if rows % batch:
            found.append(f"Total batch size ({rows}) is not a multiple of batch_size ({batch}) [Policy.train]")
        if batch % dp:
            found.append(f"Batch size ({batch}) is not a multiple of shards ({dp}) [Policy.train]")
        if rows % dp:
            found.append(f"Batch size ({rows}) is not a multiple of shards ({dp}) [Policy.get_logprobs]")
        if self.micro_batch and not batch % dp and (batch // dp) % self.micro_batch:
            found.append(
                f"Data dict size ({batch // dp}) is not a multiple of the provided microbatch size "
                f"({self.micro_batch}) [the policy worker's train]"
            )
        if self.logprob_batch and not rows % dp and (rows // dp) % self.logprob_batch:
            found.append(
                f"Data dict size ({rows // dp}) is not a multiple of the provided microbatch size "
                f"({self.logprob_batch}) [the policy worker's get_logprobs]"
            )
        return found


def split_of(master: dict[str, Any], data_parallel: int) -> Split:
    policy, grpo = master["policy"], master["grpo"]
    by_tokens = policy["sequence_packing"].get("enabled") or policy["dynamic_batching"].get("enabled")
    return Split(
        prompts=grpo["num_prompts_per_step"],
        generations=grpo["num_generations_per_prompt"],
        global_batch=policy["train_global_batch_size"],
        data_parallel=data_parallel,
        micro_batch=None if by_tokens else policy["train_micro_batch_size"],
        logprob_batch=None if by_tokens else policy["logprob_batch_size"],
    )


def repair(split: Split) -> dict[str, int]:
    """The fewest changes that make the split pass: the micro-batch sizes first (memory only), then the global
    batch (the rows' divisor nearest the one asked for), then the prompts per step (nearest first, the group size
    kept); NeMo-RL's keys with their new values, empty when nothing fails."""
    if not split.problems():
        return {}
    changes: dict[str, int] = {}
    fitted = _fit_batches(split)
    if fitted is None:
        prompts = _nearest_prompts(split)
        changes[PROMPTS] = prompts
        fitted = _fit_batches(replace(split, prompts=prompts, global_batch=prompts * split.generations))
    assert fitted is not None and not fitted.problems(), f"no repair found for {split}"
    for key, before, after in (
        (GLOBAL_BATCH, split.global_batch, fitted.global_batch),
        (MICRO_BATCH, split.micro_batch, fitted.micro_batch),
        (LOGPROB_BATCH, split.logprob_batch, fitted.logprob_batch),
    ):
        if after != before:
            changes[key] = after
    return changes


def _fit_batches(split: Split) -> Split | None:
    """The split with the global batch and the micro-batch sizes moved as little as will pass; None if the rows
    themselves cannot split over the data-parallel ranks."""
    rows, dp = split.rows, split.data_parallel
    if rows % dp:
        return None
    batches = [b for b in range(dp, rows + 1, dp) if rows % b == 0]
    batch = min(batches, key=lambda b: (abs(b - split.global_batch), -b))
    return replace(
        split,
        global_batch=batch,
        micro_batch=_divisor_at_most(batch // dp, split.micro_batch),
        logprob_batch=_divisor_at_most(rows // dp, split.logprob_batch),
    )


def _divisor_at_most(n: int, size: int | None) -> int | None:
    if size is None:
        return None
    return max(d for d in range(1, min(size, n) + 1) if n % d == 0)


def _nearest_prompts(split: Split) -> int:
    """The prompts per step nearest the ones asked for (more before fewer at equal distance) whose rows split."""
    step = split.data_parallel
    for distance in range(0, split.prompts + step + 1):
        for prompts in (split.prompts + distance, split.prompts - distance):
            if prompts >= 1 and (prompts * split.generations) % split.data_parallel == 0:
                return prompts
    raise AssertionError("unreachable: prompts = data_parallel always splits")
