"""The recipes: how each algorithm turns scored rollouts into a train batch and a loss.

The loop (loop.py) is shared; a recipe only says which log-probs it needs, how it selects or
weighs rows (`prepare`), and its per-micro-batch loss. The math lives in algorithms/.
Every loss is a sum over tokens divided by the global batch's token count (token-level loss).
"""

from __future__ import annotations

from typing import Callable

import torch

from rlsteps.engine.algorithms import grpo, reinforce, rs
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.config import GRPOConfig, RecipeConfig, ReinforceConfig, RSConfig
from rlsteps.engine.rewards.sources import Scores

LogprobFn = Callable[[RolloutBatch], torch.Tensor]  # batch -> [B, T-1] fp32, no grad
ROW_MASK = "row_mask"  # extras key: [B] float, 0 = the row stays out of the loss


def loss_mask(batch: RolloutBatch) -> torch.Tensor:  # [B, T-1]
    row = batch.extras.get(ROW_MASK)
    mask = batch.response_mask()
    return mask if row is None else mask * row[:, None]


def _rollout_stats(batch: RolloutBatch, scores: Scores) -> dict[str, float]:
    valid = scores.rewards[scores.valid] if scores.valid.any() else scores.rewards.new_zeros(1)
    return {
        "train/reward": valid.mean().item(),
        "train/reward_std": valid.std(unbiased=False).item(),
        "train/response_length": batch.response_lengths.float().mean().item(),
        "train/fraction_ended": batch.is_end.float().mean().item(),
        "train/fraction_scored": scores.valid.float().mean().item(),
    }


class Recipe:
    needs_reference = False  # keep a frozen copy of the initial policy

    def __init__(self, cfg: RecipeConfig) -> None:
        self.cfg = cfg

    def train_rows_per_step(self) -> int:
        return self.cfg.rollout.prompts_per_step * self.cfg.rollout.num_rollouts_per_prompt

    def prepare(self, batch: RolloutBatch, scores: Scores, policy_logprobs: LogprobFn,
                reference_logprobs: LogprobFn | None) -> tuple[RolloutBatch, dict[str, float]]:
        raise NotImplementedError

    def loss(self, logprobs: torch.Tensor, batch: RolloutBatch, normaliser: float) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError


class RejectionSampling(Recipe):
    cfg: RSConfig

    def train_rows_per_step(self) -> int:
        return self.cfg.rollout.prompts_per_step * self.cfg.rollout.top_n_rollouts

    def prepare(self, batch, scores, policy_logprobs, reference_logprobs):
        group, _ = batch.group_index()
        rewards = scores.rewards.masked_fill(~scores.valid, float("-inf"))  # an unscored row is never selected
        keep = rs.select_topk(rewards, group, self.cfg.rollout.top_n_rollouts)
        selected = batch.select(keep)
        selected.extras[ROW_MASK] = scores.valid[keep].float()
        stats = {**_rollout_stats(batch, scores), "train/selected_reward_mean": scores.rewards[keep].mean().item()}
        return selected, stats

    def loss(self, logprobs, batch, normaliser):
        return rs.masked_nll_loss(logprobs, loss_mask(batch), normaliser)


class ReinforceRLOO(Recipe):
    cfg: ReinforceConfig
    needs_reference = True

    def prepare(self, batch, scores, policy_logprobs, reference_logprobs):
        mask = batch.response_mask()
        logp, logp_init = policy_logprobs(batch), reference_logprobs(batch)
        kl = reinforce.sequence_kl(logp, logp_init, mask, absolute=self.cfg.reinforce.use_absolute_kl)  # [B]
        r_kl = reinforce.kl_penalised_rewards(scores.rewards, kl, self.cfg.reinforce.initial_policy_kl_penalty)
        group, _ = batch.group_index()
        ended = batch.is_end & scores.valid
        baseline = reinforce.rloo_baseline(r_kl, group, ended)
        batch.extras["advantages"] = r_kl - baseline
        batch.extras[ROW_MASK] = ended.float()  # only properly ended, scored samples carry a gradient
        stats = {
            **_rollout_stats(batch, scores),
            "train/rewards_with_kl": r_kl.mean().item(),
            "train/init_policy_kl": kl.mean().item(),
            "train/fraction_of_samples_properly_ended": batch.is_end.float().mean().item(),
            "train/advantage_abs_mean": (r_kl - baseline).abs().mean().item(),
        }
        return batch, stats

    def loss(self, logprobs, batch, normaliser):
        return reinforce.reinforce_loss(logprobs, batch.extras["advantages"], loss_mask(batch), normaliser)


class GRPO(Recipe):
    cfg: GRPOConfig

    @property
    def needs_reference(self) -> bool:
        return self.cfg.grpo.kl_beta > 0

    def prepare(self, batch, scores, policy_logprobs, reference_logprobs):
        g = self.cfg.grpo
        valid = scores.valid & batch.is_end if g.overlong_filtering else scores.valid.clone()
        group, _ = batch.group_index()
        advantages = grpo.group_advantages(scores.rewards, group, valid, leave_one_out=g.leave_one_out,
                                           normalize_std=g.normalize_std, std_floor=g.std_floor)
        stats = _rollout_stats(batch, scores)
        if g.dynamic_sampling:
            flat = grpo.zero_variance_groups(scores.rewards, group, valid)
            stats["train/fraction_dropped_zero_variance"] = flat.float().mean().item()
            keep = torch.nonzero(~flat).flatten()
            batch, advantages, valid = batch.select(keep), advantages[keep], valid[keep]
        batch.extras["advantages"] = advantages
        batch.extras[ROW_MASK] = valid.float()
        batch.extras["old_logprobs"] = policy_logprobs(batch)
        if self.needs_reference:
            batch.extras["ref_logprobs"] = reference_logprobs(batch)
        stats.update({
            "train/fraction_masked": 1.0 - valid.float().mean().item() if len(valid) else 1.0,
            "train/advantage_mean": advantages.mean().item() if len(advantages) else 0.0,
            "train/advantage_abs_mean": advantages.abs().mean().item() if len(advantages) else 0.0,
        })
        return batch, stats

    def loss(self, logprobs, batch, normaliser):
        g = self.cfg.grpo
        return grpo.clipped_policy_loss(
            logprobs, batch.extras["old_logprobs"], batch.extras["advantages"], loss_mask(batch), normaliser,
            eps_low=g.eps_low, eps_high=g.eps_high, ref_logprobs=batch.extras.get("ref_logprobs"), kl_beta=g.kl_beta,
        )


RECIPES: dict[str, type[Recipe]] = {"rs": RejectionSampling, "reinforce": ReinforceRLOO, "grpo": GRPO}
