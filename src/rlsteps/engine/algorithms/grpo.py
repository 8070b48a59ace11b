"""GRPO: group-relative advantages, the clipped ratio objective and the k3 KL penalty (NeMo-RL semantics).

    A_i   = (r_i - b_i) / std_i      b = group mean or leave-one-out mean; std over the same set
                                     (the group, or the others), and / std only when std > floor
    ratio = exp(logp - logp_old)
    L_t   = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high)) + beta * k3_t
    loss  = sum_t L_t * mask_t / normaliser    (token mean over the whole global batch)

Under top-k/top-p the ratio reads the sampled (filtered) distribution's log-probs and k3 the policy's under the
temperature alone, as the reference's are (NeMo-RL's ClippedPGLossFn: curr_logprobs and curr_logprobs_unfiltered).

The std floor (1e-3) keeps a group whose rewards differ only by noise from being blown up to
unit-scale advantages (NeMo-RL issue #1518); a zero-variance group gets zero advantage.
"""

from __future__ import annotations

import torch

from rlsteps.contract.config import GRPOConfig
from rlsteps.engine.algorithms.groups import (
    group_mean,
    group_std,
    group_totals,
    leave_one_out_mean,
    leave_one_out_std,
    number_of_groups,
)
from rlsteps.engine.algorithms.recipe import ROW_MASK, UNFILTERED_LOGPROBS, Recipe, loss_mask, rollout_stats


def group_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    valid: torch.Tensor,
    *,
    leave_one_out: bool,
    normalize_std: bool,
    std_floor: float = 1e-3,
) -> torch.Tensor:
    """Advantages [B] from rewards [B], groups [B] and the rows that count, valid [B] bool.

    Baseline and std use the group's valid rows only; invalid rows get advantage 0, and so do
    the rows of a group with at most one valid row.
    """
    r = rewards.float()
    v = valid.float()  # [B]
    count = group_totals(v, group_index)  # [B] valid rows in the row's group
    mean = group_mean(r, group_index, valid)  # [B]
    # b: the group mean or the mean of the others; in a group with at most one valid row, b_i = r_i
    baseline = leave_one_out_mean(r, group_index, valid) if leave_one_out else torch.where(count <= 1, r, mean)
    advantages = r - baseline
    if normalize_std:  # the std of the same set as the baseline: the group's valid rows, or the others of them
        std = (leave_one_out_std if leave_one_out else group_std)(r, group_index, valid)
        advantages = torch.where(std > std_floor, advantages / std.clamp(min=std_floor), advantages)
    return torch.where(valid, advantages, torch.zeros_like(advantages))


def zero_variance_groups(rewards: torch.Tensor, group_index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B] bool: the row's group has no two different valid rewards (dynamic sampling drops these)."""
    num_groups = number_of_groups(group_index)
    r, g = rewards.float()[valid], group_index[valid]
    highest = torch.full((num_groups,), -torch.inf, device=r.device).scatter_reduce(0, g, r, "amax")
    lowest = torch.full((num_groups,), torch.inf, device=r.device).scatter_reduce(0, g, r, "amin")
    no_valid_rows = torch.isinf(highest)
    return ((highest == lowest) | no_valid_rows)[group_index]


def k3_kl(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    clamp: float = 20.0,
    weights: torch.Tensor | None = None,
    output_clamp: float = 10.0,
) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference) per token, [B, T-1], as NeMo-RL's calculate_kl computes it:
    logr = ref - logp clamped to [-clamp, clamp]; k3 = exp(logr) - 1 - logr, times the per-token weights when given
    (detached where the input clamp binds), and only then clamped to [-output_clamp, output_clamp]. So where either
    clamp binds the token's KL term has no gradient at all, its score-function part included."""
    logr = ref_logprobs - logprobs
    clamped = logr.clamp(-clamp, clamp)
    kl = torch.exp(clamped) - 1 - clamped
    if weights is not None:
        kl = torch.where(logr == clamped, weights, weights.detach()) * kl
    return kl.clamp(-output_clamp, output_clamp)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normaliser: float,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    importance_weights: torch.Tensor | None = None,
    kl_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate (times the truncated importance weight w_t, when given) plus beta * k3 KL, summed
    over masked tokens and divided by `normaliser`.

    logprobs, old_logprobs, ref_logprobs, mask, importance_weights: [b, T-1]; advantages: [b]. kl_logprobs [b, T-1]:
    the policy's log-probs the KL reads, of the same forward as logprobs (under top-k/top-p, those under the
    temperature alone); None: logprobs.
    """
    if kl_beta and ref_logprobs is None:
        raise ValueError("kl_beta > 0 needs ref_logprobs: compute the reference policy's log-probs or set kl_beta=0")
    a = advantages.detach()[:, None]  # [b, 1]
    ratio = torch.exp(logprobs - old_logprobs.detach())  # [b, T-1]
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    unclipped_loss, clipped_loss = -a * ratio, -a * clipped
    token_loss = torch.maximum(unclipped_loss, clipped_loss)
    if importance_weights is not None:
        token_loss = token_loss * importance_weights
    # k3 weighted by exp(logp - sg(logp)): 1 in value, and in the gradient the score-function term of E_pi[k3] (the
    # tokens were sampled from the policy), as NeMo-RL's ClippedPGLossFn and TRL's on-policy KL correction have it
    kl_logprobs = logprobs if kl_logprobs is None else kl_logprobs
    score_weights = torch.exp(kl_logprobs - kl_logprobs.detach())
    kl = (
        k3_kl(kl_logprobs, ref_logprobs.detach(), weights=score_weights)
        if ref_logprobs is not None
        else torch.zeros_like(logprobs)
    )
    token_loss = token_loss + kl_beta * kl
    loss = (token_loss * mask).sum() / max(normaliser, 1.0)
    return loss, _policy_stats(loss, ratio, clipped_loss > unclipped_loss, kl, logprobs, mask)


def _policy_stats(
    loss: torch.Tensor,
    ratio: torch.Tensor,
    clip_active: torch.Tensor,
    kl: torch.Tensor,
    logprobs: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, float]:
    """Means over the masked tokens of this micro-batch; the clip fraction counts tokens whose gradient the clip cut."""
    on = mask > 0
    tokens = float(on.sum())

    def masked_mean(x: torch.Tensor) -> float:
        return float((x.detach().float() * on).sum()) / max(tokens, 1.0)

    ratios = ratio.detach()[on]
    return {
        "loss": loss.item(),
        "tokens": tokens,
        "ratio_mean": masked_mean(ratio),
        "ratio_min": float(ratios.min()) if tokens else 1.0,
        "ratio_max": float(ratios.max()) if tokens else 1.0,
        "clip_fraction": masked_mean(clip_active),
        "kl_mean": masked_mean(kl),
        "entropy_proxy": masked_mean(-logprobs),
    }


class GRPO(Recipe):
    """Rewards -> rows that count -> group advantages -> (dynamic sampling) -> old/ref log-probs -> clipped loss.

    With one optimizer step per batch the old log-probs are the update forward's own, detached: the ratio is 1 in
    value and its gradient is the log-prob's, as with a separate pass (whose values differ only by rounding)."""

    cfg: GRPOConfig
    kl_penalty_key = "grpo.kl_beta"

    @property
    def needs_reference(self) -> bool:
        return self.cfg.grpo.kl_beta > 0

    def reference_of_every_row(self) -> bool:
        return self.needs_reference and not self.cfg.grpo.dynamic_sampling  # it drops groups before asking

    def _counted(self, batch, scores) -> torch.Tensor:
        """[B] bool: the rows that count in the baseline, the std and the loss."""
        return scores.valid & batch.is_end if self.cfg.grpo.overlong_filtering else scores.valid.clone()

    def dropped_groups(self, batch, scores):
        """With grpo.dynamic_sampling, the groups whose counted rewards do not differ (zero advantage everywhere)."""
        if not self.cfg.grpo.dynamic_sampling:
            return None
        group, _ = batch.group_index()
        flat = zero_variance_groups(scores.rewards, group, self._counted(batch, scores))  # [B]
        return flat[:: self.cfg.rollout.num_rollouts_per_prompt].tolist()

    def max_generation_batches(self) -> int:
        return self.cfg.grpo.dynamic_sampling_max_gen_batches

    def prepare(self, batch, scores, policy_logprobs, reference_logprobs):
        g = self.cfg.grpo
        valid = self._counted(batch, scores)  # [B] rows that count
        group, _ = batch.group_index()
        advantages = group_advantages(
            scores.rewards,
            group,
            valid,
            leave_one_out=g.leave_one_out,
            normalize_std=g.normalize_std,
            std_floor=g.std_floor,
        )  # [B]
        stats = rollout_stats(batch, scores)
        if g.dynamic_sampling:
            flat = zero_variance_groups(scores.rewards, group, valid)
            stats["train/fraction_dropped_zero_variance"] = flat.float().mean().item()
            keep = torch.nonzero(~flat).flatten()
            batch, advantages, valid = batch.select(keep), advantages[keep], valid[keep]
        batch.extras["advantages"] = advantages
        batch.extras[ROW_MASK] = valid.float()
        if not self.logprobs_from_update():  # else the ratio's denominator is the update's forward, detached
            batch.extras["old_logprobs"] = policy_logprobs(batch)  # [B, T-1]: the ratio's denominator
            stats.update(self.compare_with_sampler(batch, batch.extras["old_logprobs"]))
        if self.needs_reference:
            batch.extras["ref_logprobs"] = reference_logprobs(batch)
        stats.update(
            {
                "train/fraction_masked": 1.0 - valid.float().mean().item() if len(valid) else 1.0,
                "train/advantage_mean": advantages.mean().item() if len(advantages) else 0.0,
                "train/advantage_abs_mean": advantages.abs().mean().item() if len(advantages) else 0.0,
            }
        )
        return batch, stats

    def loss(self, logprobs, batch, normaliser):
        g = self.cfg.grpo
        old_logprobs = batch.extras.get("old_logprobs")
        if old_logprobs is None:
            if not self.logprobs_from_update():
                raise KeyError("old_logprobs: this batch makes several optimizer steps, so prepare must set them")
            old_logprobs = logprobs.detach()  # one optimizer step: the weights that sampled are these; ratio 1
        return clipped_policy_loss(
            logprobs,
            old_logprobs,
            batch.extras["advantages"],
            loss_mask(batch),
            normaliser,
            eps_low=g.eps_low,
            eps_high=g.eps_high,
            ref_logprobs=batch.extras.get("ref_logprobs"),
            kl_beta=g.kl_beta,
            importance_weights=self.importance_weights(logprobs, batch),
            kl_logprobs=batch.extras.get(UNFILTERED_LOGPROBS),
        )
