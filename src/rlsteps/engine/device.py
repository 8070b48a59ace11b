"""Where models run: 'auto' picks the GPU when there is one; asking for CUDA without one is a clear error."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for, but no CUDA device is visible; use cpu or auto")
    return torch.device(name)
