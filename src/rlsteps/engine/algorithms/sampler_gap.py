"""The gap between the sampler's and the trainer's probabilities of the sampled tokens, and its correction.

A rollout's tokens are drawn from the sampler (vLLM, or the built-in sampler in another batch layout and
precision); the loss differentiates the trainer's log-probs. The two agree up to kernels and rounding when the
weights are in sync, and drift apart when they are not. Per response token t, with d_t = log p_trainer - log
p_sampler:

    token_mult_prob_error = mean_t exp(|d_t|)                 (1.0: identical; NeMo-RL's health metric)
    w_t = min(exp(d_t), cap)                                  (truncated importance weight, a constant)

The policy-gradient loss of token t is multiplied by w_t when train.truncated_importance_sampling is on: the
expectation is then over the trainer's policy, with the weight capped so a token the sampler found far less
likely than the trainer does cannot dominate a step.
"""

from __future__ import annotations

import torch

IMPORTANCE_WEIGHTS = "importance_weights"  # extras key: [B, T-1] truncated importance weights


def token_mult_prob_error(trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of exp(|trainer - sampler|) over the masked tokens ([B, T-1] each); 1.0 when no token is masked in."""
    tokens = mask.sum()
    if not tokens:
        return 1.0
    gap = (trainer.float() - sampler.float()).abs()
    return float((gap.exp() * mask).sum() / tokens)


def truncated_importance_weights(trainer: torch.Tensor, sampler: torch.Tensor, cap: float) -> torch.Tensor:
    """min(p_trainer / p_sampler, cap) per token: [B, T-1], no gradient."""
    return (trainer.detach().float() - sampler.float()).exp().clamp(max=cap)


def sampler_gap_stats(
    trainer: torch.Tensor, sampler: torch.Tensor | None, mask: torch.Tensor, cap: float | None = None
) -> dict[str, float]:
    """The step's train/token_mult_prob_error (nothing when the rollouts carry no sampler log-probs); with the
    importance weights' cap, their figures too (importance_weight_stats)."""
    if sampler is None:
        return {}
    stats = {"train/token_mult_prob_error": token_mult_prob_error(trainer, sampler, mask)}
    return stats if cap is None else {**stats, **importance_weight_stats(trainer, sampler, mask, cap)}


def importance_weight_stats(
    trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, cap: float
) -> dict[str, float]:
    """Over the masked tokens: the truncated weights' mean and largest value, and the share of tokens whose
    p_trainer / p_sampler the cap cut (NeMo-RL logs the same three of its importance-sampling correction)."""
    tokens = mask.sum()
    if not tokens:
        return {}
    ratio = (trainer.float() - sampler.float()).exp()
    inside = mask.bool()
    return {
        "train/importance_weight_mean": float((ratio.clamp(max=cap) * mask).sum() / tokens),
        "train/importance_weight_max": float(ratio.clamp(max=cap)[inside].max()),
        "train/importance_weight_clipped": float(((ratio > cap) & inside).sum() / tokens),
    }
