"""The distribution the rollouts were drawn from, as training scores them: the logits divided by the sampling
temperature, then top-k and top-p as the sampler filters them, renormalised. A policy gradient, a ratio, a KL term or
an importance weight is only right under the distribution that drew the tokens; at temperature 0.7 the raw model's
log-probs are not it.

As NeMo-RL v0.7.0 scores them (nemo_rl/algorithms/logits_sampling_utils.py, TrainingSamplingParams): the policy's
log-probs, old and new, under temperature and filters, the filtered tokens getting no gradient (the ratio, the
importance weights, the sampler comparison); the reference policy's under the temperature alone (its own top-k/top-p
set would differ from the policy's). A KL to the reference compares like with like: it reads the policy's log-probs
under the temperature alone too (NeMo-RL's curr_logprobs_unfiltered, prepare_loss_input), from the same logits, so
`logprobs(..., unfiltered=True)` gives both sets of one forward. The sampler records its tokens' log-probs under the
sampled distribution (rlsteps.engine.generation.sampling; vLLM's processed_logprobs).

One difference, on purpose: a token the filter would drop is kept when it is the one scored. Recomputed logits can
differ from the sampler's in the last bits (another batch shape, another kernel), and a sampled token at the edge of
the nucleus would otherwise score -inf and make the loss NaN; NeMo-RL leaves it -inf.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from rlsteps.engine.generation.sampling import top_k_filter, top_p_filter


@dataclass(frozen=True)
class SampledDistribution:
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off

    @classmethod
    def of(cls, sampling: Any) -> SampledDistribution:
        """The distribution of a sampling config (rollout.sampling; a SamplingParams). Greedy (temperature 0) draws
        from no distribution: its tokens are scored under the raw one, as NeMo-RL's temperature scaling leaves 0."""
        temperature = float(sampling.temperature)
        return cls(temperature=temperature if temperature > 0 else 1.0, top_k=int(sampling.top_k), top_p=sampling.top_p)

    @property
    def filtered(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0

    @property
    def is_raw(self) -> bool:
        """The model's own distribution: nothing to do to its logits."""
        return self.temperature == 1.0 and not self.filtered

    def without_filters(self) -> SampledDistribution:
        """The reference policy's: the temperature alone."""
        return replace(self, top_k=0, top_p=1.0)

    def scaled(self, values: torch.Tensor) -> torch.Tensor:
        """Logits, or the hidden states a linear head turns into them, divided by the temperature."""
        return values if self.temperature == 1.0 else values / self.temperature

    def logprobs(self, logits: torch.Tensor, targets: torch.Tensor, unfiltered: bool = False) -> torch.Tensor:
        """log p(target) under this distribution: [N, V] logits, [N] targets -> [N] fp32 (fp64 stays fp64).
        Differentiable: the filtered-out tokens get no gradient, the kept ones the renormalised softmax's.
        unfiltered: [2, N], these and the log-probs under the temperature alone (the KL's), from the same logits."""
        scaled = self.scaled(logits.to(torch.promote_types(logits.dtype, torch.float32)))
        sampled = _picked(self._filtered(scaled, targets) if self.filtered else scaled, targets)
        if not unfiltered:
            return sampled
        return torch.stack([sampled, _picked(scaled, targets) if self.filtered else sampled])

    def _filtered(self, scaled: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Scaled logits [N, V] with the tokens top-k and top-p drop at -inf, each row's target kept."""
        with torch.no_grad():
            dropped = torch.isinf(top_p_filter(top_k_filter(scaled, self.top_k), self.top_p))  # [N, V]
            dropped[torch.arange(len(targets), device=targets.device), targets] = False  # the scored token stays
        return scaled.masked_fill(dropped, -torch.inf)


def _picked(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # [N, V], [N] -> [N]
    return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
