"""What a recipe is: from scored rollouts to a train batch (`prepare`) and a per-micro-batch loss (`loss`).

The loop is shared; a recipe says which log-probs it needs, which rows learn and with what weight, its
loss, and the token count its loss is normalised by (token-level loss: a sum over tokens divided by the
global batch's count of loss tokens).

The policy's log-probs before the update (GRPO's old log-probs, REINFORCE's KL to the initial policy, the
sampler comparison) come from one of two places. When the step makes a single optimizer step
(`logprobs_from_update`), the update's own forward runs on the weights that sampled, before anything changes
them: the recipe's loss takes them from there, detached, and prepare runs no pass of the policy. Otherwise
(several optimizer steps: the weights move after the first) prepare computes them in a no-grad pass of their own.
The update's forward runs in train mode, the separate pass in eval mode: the same numbers for the policies trained
here (no dropout); a model with dropout would see it in its old log-probs too, where its ratio stays exactly 1.

Under top-k/top-p the policy has two sets of log-probs, as in NeMo-RL: those of the sampled (filtered) distribution,
which the policy gradient, the ratio and the importance weights read, and those under the temperature alone, which a
KL to the reference reads (the reference's are under the temperature alone). Where the recipe's KL needs them
(`kl_reads_unfiltered`), the same forward gives both: a prepare pass asks the LogprobFn for them, and the update puts
the forward's in the micro-batch's extras under UNFILTERED_LOGPROBS (NeMo-RL's data["curr_logprobs_unfiltered"]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from rlsteps.contract.config import RecipeConfig
from rlsteps.engine.algorithms.sampler_gap import IMPORTANCE_WEIGHTS, sampler_gap_stats, truncated_importance_weights
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.policy.sampled_distribution import SampledDistribution

if TYPE_CHECKING:  # for annotations only: the math needs no reward client
    from rlsteps.engine.rewards.scores import Scores

ROW_MASK = "row_mask"  # extras key: [B] float, 0 = the row stays out of the loss
UNFILTERED_LOGPROBS = "unfiltered_logprobs"  # extras key: [B, T-1], the policy's under the temperature alone


class LogprobFn(Protocol):
    def __call__(self, batch: RolloutBatch, unfiltered: bool = False) -> torch.Tensor:
        """[B, T-1] fp32, no grad, under the sampled distribution; unfiltered: [2, B, T-1], those and the log-probs
        under the temperature alone, of the same passes."""
        ...


def loss_mask(batch: RolloutBatch) -> torch.Tensor:  # [B, T-1]
    """The tokens a loss counts: response tokens (EOS included) of the rows that learn."""
    row = batch.extras.get(ROW_MASK)
    mask = batch.response_mask()
    return mask if row is None else mask * row[:, None]


def rollout_stats(batch: RolloutBatch, scores: Scores) -> dict[str, float]:
    # no valid reward at all: NaN (logged as null, shown as "-"), never a made-up 0
    valid = scores.rewards[scores.valid] if scores.valid.any() else scores.rewards.new_full((1,), float("nan"))
    return {
        "train/reward": valid.mean().item(),
        "train/reward_std": valid.std(unbiased=False).item(),
        "train/response_length": batch.response_lengths.float().mean().item(),
        "train/fraction_ended": batch.is_end.float().mean().item(),
        "train/fraction_scored": scores.valid.float().mean().item(),
    }


class Recipe:
    needs_reference = False  # keep a frozen copy of the initial policy
    kl_penalty_key: str | None = None  # the config key of the recipe's KL penalty to the initial policy, if any
    two_pass = False  # True: the policy's log-probs from a pass of their own in prepare, even where one step is made

    def __init__(self, cfg: RecipeConfig) -> None:
        self.cfg = cfg

    def reference_of_every_row(self) -> bool:
        """Whether prepare asks for the reference's log-probs of the very batch it is given (no row filtered out
        first): the step then computes them while the rewards are scored, which they do not depend on."""
        return self.needs_reference

    def train_rows_per_step(self) -> int:
        return self.cfg.rollout.prompts_per_step * self.cfg.rollout.num_rollouts_per_prompt

    def loss_distribution(self) -> SampledDistribution:
        """The distribution the loss scores the policy's tokens under: the one the rollouts were drawn from (a policy
        gradient's ratio, KL and importance weights are only right under it); rejection sampling's NLL overrides it."""
        return SampledDistribution.of(self.cfg.rollout.sampling)

    def kl_reads_unfiltered(self) -> bool:
        """Whether the recipe's KL to the reference needs the policy's log-probs under the temperature alone, apart
        from the sampled distribution's: a KL to the reference under top-k/top-p (the set is the same without them)."""
        return self.needs_reference and self.loss_distribution().filtered

    def policy_and_kl_logprobs(
        self, batch: RolloutBatch, policy_logprobs: LogprobFn
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's log-probs [B, T-1] before the update, of one pass: the sampled distribution's and the KL's."""
        if not self.kl_reads_unfiltered():
            logprobs = policy_logprobs(batch)
            return logprobs, logprobs
        both = policy_logprobs(batch, unfiltered=True)
        return both[0], both[1]

    def logprobs_from_update(self) -> bool:
        """Whether the policy's log-probs before the update are the update's own forward, detached (no pass of the
        policy in prepare): when every row of the step fits one global batch (one optimizer step, so the forward
        runs on the weights that sampled) and each micro-batch holds every row its loss reads.

        A function of the config alone, so every process decides alike: a valid world deals each process
        prompts_per_step / W prompt groups and global_batch_size / W rows per optimizer step (world_check), and
        filtering (dynamic sampling, top-n) only removes rows. The update checks it made a single step."""
        return (
            not self.two_pass
            and self.train_rows_per_step() <= self.cfg.train.global_batch_size
            and self._micro_batches_self_contained()
        )

    def _micro_batches_self_contained(self) -> bool:
        """Whether a micro-batch's loss reads the log-probs of its own rows only (true of per-token losses)."""
        return True

    def loss_reads_whole_groups(self) -> bool:
        """Whether a micro-batch's loss reads every row of each prompt group in it (a baseline made in the loss):
        micro-batches must then hold whole groups. Per-token losses read their own rows only."""
        return False

    def dropped_groups(self, batch: RolloutBatch, scores: Scores) -> list[bool] | None:
        """Dynamic sampling: for each prompt group of a generation batch (rows in prompt order, each group's adjacent),
        whether it is dropped and another drawn in its place (algorithms.dynamic_sampling). None: every group trains."""
        return None

    def max_generation_batches(self) -> int:
        """The bound on a step's generation batches where groups are dropped (dropped_groups)."""
        return 1

    def prepare(
        self, batch: RolloutBatch, scores: Scores, policy_logprobs: LogprobFn, reference_logprobs: LogprobFn | None
    ) -> tuple[RolloutBatch, dict[str, float]]:
        raise NotImplementedError

    def compare_with_sampler(self, batch: RolloutBatch, trainer_logprobs: torch.Tensor) -> dict[str, float]:
        """The sampler's agreement with the trainer on these rollouts, and (when asked) the truncated importance
        weights the policy-gradient loss multiplies its tokens by, set in batch.extras."""
        train = self.cfg.train
        sampler = batch.gen_logprobs
        if train.truncated_importance_sampling and sampler is not None:
            weights = truncated_importance_weights(
                trainer_logprobs, sampler.to(trainer_logprobs.device), train.importance_sampling_cap
            )
            batch.extras[IMPORTANCE_WEIGHTS] = weights
        mask = batch.response_mask().to(trainer_logprobs.device)
        return sampler_gap_stats(trainer_logprobs, sampler, mask, self._importance_cap())

    def importance_weights(self, logprobs: torch.Tensor, batch: RolloutBatch) -> torch.Tensor | None:
        """A micro-batch's truncated importance weights: those prepare set, or (log-probs from the update) the
        same function of the forward's own log-probs, detached; None when not asked for or without sampler
        log-probs."""
        weights = batch.extras.get(IMPORTANCE_WEIGHTS)
        if weights is None and self.cfg.train.truncated_importance_sampling and batch.gen_logprobs is not None:
            sampler = batch.gen_logprobs.to(logprobs.device)
            weights = truncated_importance_weights(logprobs.detach(), sampler, self.cfg.train.importance_sampling_cap)
        return weights

    def update_stats(self, batch: RolloutBatch, trainer_logprobs: torch.Tensor) -> dict[str, float]:
        """The statistics prepare gives from the policy's log-probs, when they came from the update instead
        (`logprobs_from_update`): trainer_logprobs [B, T-1], detached, of the batch's rows."""
        sampler = batch.gen_logprobs
        mask = batch.response_mask().to(trainer_logprobs.device)
        sampler = None if sampler is None else sampler.to(mask.device)
        return sampler_gap_stats(trainer_logprobs, sampler, mask, self._importance_cap())

    def _importance_cap(self) -> float | None:
        """The importance weights' cap where the loss weighs its tokens by them (their figures are logged)."""
        train = self.cfg.train
        return train.importance_sampling_cap if train.truncated_importance_sampling else None

    def loss_normaliser(self, global_batch: RolloutBatch) -> float:
        """The loss tokens of one global batch (all its micro-batches): every micro-batch's loss divides by it."""
        return loss_mask(global_batch).sum().item()

    def loss(
        self, logprobs: torch.Tensor, batch: RolloutBatch, normaliser: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError
