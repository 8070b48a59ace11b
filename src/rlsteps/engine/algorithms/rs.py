"""Rejection sampling: keep the best rollouts of each prompt and fine-tune on them.

Selection follows NeMo-Aligner: per prompt, a stable ascending sort by reward and the last
`top_n` rows, so on a tie the later rollout wins. Groups are the explicit prompt ids of the
batch (`RolloutBatch.group_index()`), never rows with equal padded tokens.
"""

from __future__ import annotations

import torch

from rlsteps.contract.config import RSConfig
from rlsteps.engine.algorithms.recipe import ROW_MASK, Recipe, loss_mask, rollout_stats
from rlsteps.engine.policy.sampled_distribution import SampledDistribution


def select_topk(rewards: torch.Tensor, group_index: torch.Tensor, top_n: int) -> torch.Tensor:
    """Row indices of the `top_n` best rollouts of every group, in ascending row order.

    rewards: [B] float, group_index: [B] long (dense group number per row).
    """
    if top_n < 1:
        raise ValueError(f"top_n must be at least 1, got {top_n}; set top_n_rollouts to 1 or more")
    selected = []
    for group in torch.unique(group_index):
        rows = torch.nonzero(group_index == group).squeeze(1)  # [N] ascending rollout order
        if top_n > len(rows):
            raise ValueError(
                f"top_n={top_n} exceeds the {len(rows)} rollouts of group {int(group)}; "
                "set top_n_rollouts <= num_rollouts_per_prompt"
            )
        ascending = torch.sort(rewards[rows], stable=True).indices  # ties keep rollout order
        selected.append(rows[ascending[len(rows) - top_n :]])
    if not selected:
        return torch.empty(0, dtype=torch.long)
    return torch.sort(torch.cat(selected)).values


def masked_nll_loss(
    logprobs: torch.Tensor, mask: torch.Tensor, normaliser: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood of the response tokens (EOS included), summed and divided by `normaliser`.

    logprobs, mask: [b, T-1]. `normaliser` is the number of valid tokens of the whole global
    batch, so the losses of its micro-batches add up to the global token mean. A global batch
    without any valid token gives a zero loss.
    """
    token_nll = -logprobs * mask  # [b, T-1]
    loss = token_nll.sum() / max(normaliser, 1.0)
    tokens = float(mask.sum())
    stats = {"loss": loss.item(), "nll_mean": token_nll.sum().item() / max(tokens, 1.0), "tokens": tokens}
    return loss, stats


class RejectionSampling(Recipe):
    """Rewards -> the top n rollouts of each prompt -> masked NLL on them."""

    cfg: RSConfig

    def train_rows_per_step(self) -> int:
        return self.cfg.rollout.prompts_per_step * self.cfg.rollout.top_n_rollouts

    def loss_distribution(self) -> SampledDistribution:
        """Fine-tuning on the kept rollouts is the model's own likelihood (SFT), whatever they were sampled at."""
        return SampledDistribution()

    def prepare(self, batch, scores, policy_logprobs, reference_logprobs):
        group, _ = batch.group_index()
        rewards = scores.rewards.masked_fill(~scores.valid, float("-inf"))  # an unscored row is never selected
        keep = select_topk(rewards, group, self.cfg.rollout.top_n_rollouts)  # [n * groups] row indices
        selected = batch.select(keep)
        selected.extras[ROW_MASK] = scores.valid[keep].float()
        stats = {
            **rollout_stats(batch, scores),
            "train/selected_reward_mean": scores.rewards[keep].mean().item(),
        }
        if selected.gen_logprobs is not None and not self.logprobs_from_update():  # else from the update's forward
            # the sampler's agreement, on the kept rows: a pass over few
            stats.update(self.compare_with_sampler(selected, policy_logprobs(selected)))
        return selected, stats

    def loss(self, logprobs, batch, normaliser):
        return masked_nll_loss(logprobs, loss_mask(batch), normaliser)
