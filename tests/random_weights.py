"""Random weights of order one for the tiny models of the checkpoint tests, so that a misplaced tensor shows in the
logits. Imports torch alone: tests/make_bridge_checkpoint.py uses it too, in its own Python 3.12 environment."""

from __future__ import annotations

import torch


def randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight random and of order one (norm scales around 1, biases nonzero), so a misplaced tensor shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # RMSNorm scales in [0.5, 1.5)
                param.copy_(0.5 + torch.rand(param.shape, generator=generator))
            else:
                param.copy_(0.2 * torch.randn(param.shape, generator=generator))
    return model.eval()
