"""The train phase of a step: the prepared batch in global batches of `train.global_batch_size` rows, one
optimizer step each, over however many processes the run has.

Each process holds the rows of its own prompt groups. Optimizer step k takes rows [k*G/W, (k+1)*G/W) of every
process's batch (G rows in all; W processes). Its loss is the token-level loss of the whole global batch:
each micro-batch's token sum is divided by the loss tokens of all processes together (all-reduced), and
scaled by W, since FSDP2 averages the gradients over the processes. The gradient is clipped on its global
norm. Processes with fewer micro-batches than the busiest one run an empty one (zero loss), so every
process runs the same sharded forward and backward passes. With prompts dealt to processes in turn
(World.mine) and G/W rows per process per step, a step learns from the same rows on one process or on W.

When the recipe takes the policy's log-probs before the update from the update itself
(Recipe.logprobs_from_update: a single optimizer step), the forward of each micro-batch is also that pass: the
recipe's loss reads its own log-probs, detached, and after the micro-batches the recipe turns them, gathered at
the batch's width, into the statistics prepare would have given (weighted by each process's rows).

Where the recipe's KL reads the policy's log-probs under the temperature alone (Recipe.kl_reads_unfiltered: a KL
penalty under top-k/top-p), the same forward gives them with the sampled distribution's, into the micro-batch's
extras (recipe.UNFILTERED_LOGPROBS): no second pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from rlsteps.contract.config import RecipeConfig, TrainConfig
from rlsteps.engine.algorithms.recipe import UNFILTERED_LOGPROBS, Recipe
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.distributed import (
    SINGLE,
    World,
    all_gather,
    reduce_floats,
    reduce_max,
    reduce_sum,
    row_weighted_mean,
)
from rlsteps.engine.policy.logprobs import packed_token_logprobs, reads_packed_sequences, token_logprobs
from rlsteps.engine.policy.optim import optimizer_step
from rlsteps.engine.policy.parallel import Precision, set_gradient_sync


@dataclass
class UpdateResult:
    stats: dict[str, float]
    optimizer_steps: int  # updates made
    skipped: int  # updates skipped on a non-finite gradient
    tokens: int  # tokens through the forward and backward passes, all processes
    response_tokens: int  # of them, the response tokens: the positions the LM head scored


@dataclass
class TokenCount:
    total: int = 0
    responses: int = 0

    def add(self, batch: RolloutBatch) -> None:
        self.total += int(batch.sequence_lengths.sum())
        self.responses += int(batch.response_lengths.sum())

    def merge(self, other: TokenCount) -> None:
        self.total += other.total
        self.responses += other.responses


@dataclass
class PolicyUpdate:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    recipe: Recipe
    train: TrainConfig
    device: torch.device
    precision: Precision = field(default_factory=Precision)
    world: World = SINGLE
    forward: nn.Module = field(init=False)  # what the training passes call: the model, or it compiled (train.compile)
    packing: bool = field(init=False)  # train.sequence_packing, where the model reads packed sequences

    def __post_init__(self) -> None:
        # the compiled module shares the model's parameters; the optimizer, checkpoints and sync keep the model
        self.forward = torch.compile(self.model) if self.train.compile else self.model
        autocast = lambda: self.precision.autocast(self.device)  # noqa: E731
        # the probe runs the forward as the passes will: a compiled one traced by dynamo (as its graph is captured;
        # inductor's code would only round differently), which can lose what keeps packed sequences apart
        probed = torch.compile(self.model, backend="eager") if self.train.compile else self.model
        self.packing = self.train.sequence_packing and reads_packed_sequences(probed, self.device, autocast)

    def __call__(self, batch: RolloutBatch) -> UpdateResult:
        t, world = self.train, self.world
        rows = t.global_batch_size // world.size  # this process's rows of each optimizer step
        steps = int(reduce_max(world, math.ceil(len(batch) / rows)))
        from_update = self.recipe.logprobs_from_update()  # the same on every process: a function of the config
        if from_update and steps > 1:
            raise RuntimeError(
                f"{len(batch)} rows on this process make {steps} optimizer steps of {rows}, but the recipe took the "
                "policy's log-probs from the update, which holds for one step only: every process needs at most "
                "train.global_batch_size / world size rows (rollout.prompts_per_step a multiple of the world size)"
            )
        stats, made, skipped, tokens = StepStats(), 0, 0, TokenCount()
        prepared: dict[str, float] = {}  # the recipe's statistics of the forward's log-probs (from_update)
        self.model.train()
        for k in range(steps):
            chunk = batch.select(list(range(k * rows, min((k + 1) * rows, len(batch)))))
            normaliser = reduce_sum(world, self.recipe.loss_normaliser(chunk) if len(chunk) else 0.0)
            if normaliser == 0:
                continue  # nothing to learn from (e.g. no sample ended): skip rather than step on zero grads
            sets = (2,) if self.recipe.kl_reads_unfiltered() else ()
            logprobs = torch.zeros(*sets, len(chunk), chunk.tokens.shape[1] - 1) if from_update else None
            tokens.merge(self._accumulate(chunk, normaliser, stats, logprobs))
            if logprobs is not None and len(chunk):
                prepared = self.recipe.update_stats(chunk, self._sampled(logprobs, chunk))
            grad_norm = optimizer_step(self.model, self.optimizer, self.scheduler, t.max_grad_norm)
            stats.end_optimizer_step(grad_norm)
            made += math.isfinite(grad_norm)
            skipped += not math.isfinite(grad_norm)  # optimizer_step left the weights and the schedule unchanged
        merged = StepStats.merge(all_gather(world, stats))
        if from_update:
            prepared = row_weighted_mean(world, prepared, len(batch))
        total, responses = reduce_floats(world, [tokens.total, tokens.responses])
        return UpdateResult({**prepared, **merged.result()}, made, skipped, int(total), int(responses))

    def _accumulate(
        self, chunk: RolloutBatch, normaliser: float, stats: StepStats, logprobs_out: torch.Tensor | None = None
    ) -> TokenCount:
        """Gradients of one global batch's share on this process; the tokens it ran. logprobs_out [(2,) rows, T-1]:
        when given, filled with the forward's log-probs (detached, on the CPU; both sets where the KL reads two)."""
        plan = micro_batch_plan(chunk, self.train, self.recipe, self.packing) if len(chunk) else []
        count = int(reduce_max(self.world, len(plan)))
        tokens = TokenCount()
        for i in range(count):
            set_gradient_sync(self.model, i == count - 1)
            if i < len(plan):
                micro = chunk.select(plan[i]).to(self.device)
                with self.precision.autocast(self.device):  # log-probs of the response positions only
                    logprobs = self._logprobs(micro)
                if logprobs_out is not None:
                    logprobs_out[..., plan[i], : logprobs.shape[-1]] = logprobs.detach().cpu()
                loss, micro_stats = self.recipe.loss(self._sampled(logprobs, micro), micro, normaliser)
                stats.add(micro_stats, weight=micro_stats.get("tokens", 0) / normaliser)
                tokens.add(micro)
            else:
                loss = self._empty_pass()
            (loss * self.world.size).backward()
        return tokens

    def _logprobs(self, micro: RolloutBatch) -> torch.Tensor:
        """[b, T-1] under the loss's distribution; [2, b, T-1] with the KL's under the temperature alone."""
        distribution, unfiltered = self.recipe.loss_distribution(), self.recipe.kl_reads_unfiltered()
        if self.packing:
            longest = longest_row(self.recipe.cfg)
            return packed_token_logprobs(self.forward, micro, longest, distribution=distribution, unfiltered=unfiltered)
        mask, wanted = micro.attention_mask(), micro.response_mask()
        return token_logprobs(
            self.forward, micro.tokens, mask, positions=wanted, distribution=distribution, unfiltered=unfiltered
        )

    def _sampled(self, logprobs: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """The sampled distribution's log-probs of _logprobs' sets; the KL's, where there are two, go into the
        batch's extras (recipe.UNFILTERED_LOGPROBS)."""
        if not self.recipe.kl_reads_unfiltered():
            return logprobs
        batch.extras[UNFILTERED_LOGPROBS] = logprobs[1]
        return logprobs[0]

    def _empty_pass(self) -> torch.Tensor:
        """A forward pass that adds nothing to the gradient: this process has no rows left in this step."""
        tokens = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        with self.precision.autocast(self.device):
            wanted = torch.ones(1, 1, device=self.device)
            logprobs = token_logprobs(self.forward, tokens, torch.ones_like(tokens), positions=wanted)
        return logprobs.sum() * 0.0


def micro_batch_plan(chunk: RolloutBatch, train: TrainConfig, recipe: Recipe, packing: bool = False) -> list[list[int]]:
    """Each micro-batch's rows of a global batch's share: micro_batch_size rows in order; with train.dynamic_batching
    rows sorted by length within micro_batch_size times the longest sequence a row can have; with packing (train.
    sequence_packing, where the model reads packed sequences) rows longest first while they pack into micro_batch_size
    rows of that longest sequence. Whole prompt groups where the recipe's loss reads them. The gradient is the same
    either way: every micro-batch's loss divides by the whole global batch's loss tokens."""
    whole_groups = recipe.loss_reads_whole_groups()
    size, longest = train.micro_batch_size, longest_row(recipe.cfg)
    if packing:
        return chunk.micro_batch_rows(size, whole_groups=whole_groups, bin_tokens=longest)
    if train.dynamic_batching:
        return chunk.micro_batch_rows(size, size * longest, whole_groups=whole_groups)
    return chunk.micro_batch_rows(size)


def longest_row(cfg: RecipeConfig) -> int:
    """The longest sequence a rollout can have: the prompt's limit and the response's."""
    return cfg.data.max_prompt_tokens + cfg.rollout.sampling.max_new_tokens


class StepStats:
    """Loss statistics over micro-batches, optimizer steps and processes.

    Within an optimizer step the losses add up (each is already divided by the global token count),
    `*_min`/`*_max` keep their extremes and other statistics are token-weighted means (weights: the
    micro-batch's share of the global batch's tokens, so they add up over processes too); across
    optimizer steps, the per-step values are averaged.
    """

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.finished: list[dict[str, float]] = []
        self.extremes: dict[str, float] = {}

    def add(self, stats: dict[str, float], weight: float) -> None:
        for key, value in stats.items():
            if key == "tokens":
                continue
            if key.endswith("_min") or key.endswith("_max"):
                pick = min if key.endswith("_min") else max
                self.extremes[key] = pick(self.extremes.get(key, value), value)
            else:
                self.current[key] = self.current.get(key, 0.0) + (value if key == "loss" else value * weight)

    def end_optimizer_step(self, grad_norm: float) -> None:
        self.finished.append({**self.current, "grad_norm": grad_norm})
        self.current = {}

    @classmethod
    def merge(cls, parts: list[StepStats]) -> StepStats:
        """The statistics of all processes' shares of the same optimizer steps."""
        if len(parts) == 1:
            return parts[0]
        merged = cls()
        for k in range(len(parts[0].finished)):
            step: dict[str, float] = {}
            for part in parts:
                for key, value in part.finished[k].items():
                    step[key] = value if key == "grad_norm" else step.get(key, 0.0) + value
            merged.finished.append(step)
        for part in parts:
            for key, value in part.extremes.items():
                pick = min if key.endswith("_min") else max
                merged.extremes[key] = pick(merged.extremes.get(key, value), value)
        return merged

    def result(self) -> dict[str, float]:
        keys = {k for step in self.finished for k in step}
        means = (
            {k: sum(s.get(k, 0.0) for s in self.finished) / len(self.finished) for k in keys} if self.finished else {}
        )
        return {f"train/{k}": v for k, v in {**means, **self.extremes}.items()}
