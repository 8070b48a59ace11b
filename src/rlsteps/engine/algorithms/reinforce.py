"""REINFORCE with the RLOO (leave-one-out) baseline, as in NeMo-Aligner, with two fixes.

    kl_t = logp_t - logp_init_t              (|.| when absolute)
    R    = r - beta * mean_t(kl_t)           (KL to the initial policy folded into the reward)
    b_i  = mean of R_j over the ended j != i of i's group
    loss = sum_t -logp_t * (R - b) * mask_t / normaliser

Fixes over NeMo-Aligner:
- A sample that did not end gets the mean of its group's ended samples as baseline. NeMo-Aligner
  divides by (number ended - 1) for every sample, so with rewards [2, 7, -1, 0] and ended
  [1, 1, 1, 0] it gives the last sample 8/2 = 4; the mean of its ended peers is 8/3.
- The advantage is broadcast per sequence as [b, 1], which is right for any micro-batch size
  (NeMo-Aligner's [mbs] against [mbs, S-1] broadcast is right only for mbs = 1).

Under top-k/top-p, logp in kl_t is the policy's under the temperature alone, as the reference's is (NeMo-RL's KL
reads curr_logprobs_unfiltered); the policy gradient's logp is the sampled (filtered) distribution's.
"""

from __future__ import annotations

import torch

from rlsteps.contract.config import ReinforceConfig
from rlsteps.engine.algorithms.groups import leave_one_out_mean
from rlsteps.engine.algorithms.recipe import ROW_MASK, UNFILTERED_LOGPROBS, Recipe, loss_mask, rollout_stats
from rlsteps.engine.batch import RolloutBatch


def sequence_kl(
    logprobs: torch.Tensor, init_logprobs: torch.Tensor, mask: torch.Tensor, absolute: bool
) -> torch.Tensor:
    """Mean per-token KL estimate to the initial policy over each row's masked tokens: [B] (0 if empty)."""
    kl = logprobs - init_logprobs  # [B, T-1]
    if absolute:
        kl = kl.abs()
    return (kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def kl_penalised_rewards(rewards: torch.Tensor, seq_kl: torch.Tensor, beta: float) -> torch.Tensor:
    """R = r - beta * kl: [B]."""
    return rewards - beta * seq_kl


def rloo_baseline(rewards: torch.Tensor, group_index: torch.Tensor, is_end: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline over each group's ended samples: [B].

    A sample that did not end gets the mean of its group's ended samples; a group with at most one
    ended sample gets b_i = R_i on all its rows (zero advantage).
    """
    return leave_one_out_mean(rewards.float(), group_index, counted=is_end)


def reinforce_loss(
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normaliser: float,
    importance_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy-gradient loss -w_t * logp_t * A over masked tokens, summed and divided by `normaliser`.

    logprobs, mask: [b, T-1]; advantages: [b] (R - b, treated as a constant). To count only the
    samples that ended, the caller multiplies `mask` by is_end[:, None]. importance_weights: [b, T-1]
    constants w_t (truncated importance sampling), 1 when None.
    """
    advantages = advantages.detach()[:, None]  # [b, 1]: one advantage per sequence
    token_loss = -logprobs * advantages * mask  # [b, T-1]
    if importance_weights is not None:
        token_loss = token_loss * importance_weights
    loss = token_loss.sum() / max(normaliser, 1.0)
    tokens = float(mask.sum())
    # over the loss tokens, as the update weighs every micro-batch's statistics: the same however rows are batched
    advantage_mean = float((advantages * mask).sum()) / max(tokens, 1.0)
    return loss, {"loss": loss.item(), "tokens": tokens, "advantage_mean": advantage_mean}


class ReinforceRLOO(Recipe):
    """Rewards -> KL-penalised rewards -> leave-one-out baseline -> advantages -> policy-gradient loss.

    The KL is that of the policy that sampled. With one optimizer step per batch and micro-batches of whole
    prompt groups, the update's forward gives those log-probs (detached) before it changes any weight, and each
    micro-batch's loss makes its rows' advantages from them: the numbers of the separate pass, without the pass.
    """

    cfg: ReinforceConfig
    needs_reference = True
    kl_penalty_key = "reinforce.initial_policy_kl_penalty"

    def _micro_batches_self_contained(self) -> bool:
        """A row's baseline reads its group's KL: every micro-batch must hold whole groups (rows of a group are
        adjacent, every group has num_rollouts_per_prompt rows)."""
        micro, per_prompt = self.cfg.train.micro_batch_size, self.cfg.rollout.num_rollouts_per_prompt
        return micro % per_prompt == 0 or micro >= self.train_rows_per_step()

    def loss_reads_whole_groups(self) -> bool:
        """With one optimizer step the loss makes each row's baseline from its group's KL. Wherever micro-batches can
        hold whole groups, they do, with two passes too: both then make the same micro-batches (and, from the same
        log-probs, the same gradient bit for bit); where they cannot (two passes), rows go one by one."""
        return self._micro_batches_self_contained()

    def prepare(self, batch, scores, policy_logprobs, reference_logprobs):
        ended = batch.is_end & scores.valid
        batch.extras[ROW_MASK] = ended.float()  # only properly ended, scored samples carry a gradient
        stats = {
            **rollout_stats(batch, scores),
            "train/fraction_of_samples_properly_ended": batch.is_end.float().mean().item(),
        }
        batch.extras["ref_logprobs"] = reference_logprobs(batch)  # [B, T-1]
        if self.logprobs_from_update():  # the loss makes the advantages from the update's forward
            batch.extras["rewards"] = scores.rewards.float()
            return batch, stats
        logp, kl_logp = self.policy_and_kl_logprobs(batch, policy_logprobs)  # [B, T-1] each
        advantages, kl, rewards_with_kl = self._advantages(batch, scores.rewards, kl_logp)
        batch.extras["advantages"] = advantages
        del batch.extras["ref_logprobs"]  # the loss needs no more than the advantages
        more = _advantage_stats(advantages, kl, rewards_with_kl)
        return batch, {**stats, **more, **self.compare_with_sampler(batch, logp)}

    def _advantages(
        self, batch: RolloutBatch, rewards: torch.Tensor, logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows' advantages, KL and KL-penalised rewards [B] from the policy's log-probs [B, T-1] the KL reads (no
        gradient)."""
        r = self.cfg.reinforce
        mask = batch.response_mask().to(logprobs.device)
        kl = sequence_kl(logprobs, batch.extras["ref_logprobs"].to(logprobs.device), mask, r.use_absolute_kl)  # [B]
        rewards_with_kl = kl_penalised_rewards(rewards.to(kl.device), kl, r.initial_policy_kl_penalty)  # [B]
        group, _ = batch.group_index()
        ended = batch.extras[ROW_MASK].to(kl.device) > 0
        advantages = rewards_with_kl - rloo_baseline(rewards_with_kl, group.to(kl.device), ended)  # [B]
        return advantages, kl, rewards_with_kl

    def update_stats(self, batch, trainer_logprobs):
        kl_logprobs = batch.extras.get(UNFILTERED_LOGPROBS, trainer_logprobs)
        more = _advantage_stats(*self._advantages(batch, batch.extras["rewards"], kl_logprobs))
        return {**more, **super().update_stats(batch, trainer_logprobs)}

    def loss(self, logprobs, batch, normaliser):
        advantages = batch.extras.get("advantages")
        if advantages is None:  # one optimizer step: the micro-batch's whole groups, from this forward
            kl_logprobs = batch.extras.get(UNFILTERED_LOGPROBS, logprobs).detach()
            advantages, _, _ = self._advantages(batch, batch.extras["rewards"], kl_logprobs)
        return reinforce_loss(
            logprobs, advantages, loss_mask(batch), normaliser, self.importance_weights(logprobs, batch)
        )


def _advantage_stats(advantages: torch.Tensor, kl: torch.Tensor, rewards_with_kl: torch.Tensor) -> dict[str, float]:
    return {
        "train/rewards_with_kl": rewards_with_kl.mean().item(),
        "train/init_policy_kl": kl.mean().item(),
        "train/advantage_abs_mean": advantages.abs().mean().item(),
    }
