"""Where models run: 'auto' picks the GPU when there is one; asking for CUDA without one is a clear error. How fp32
matmuls run there, and where torch keeps what it compiles for it."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for, but no CUDA device is visible; use cpu or auto")
    return torch.device(name)


def tf32_matmuls() -> bool:
    """Whether fp32 matmuls on CUDA run on the TF32 tensor cores (torch's default is no: full fp32)."""
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    return torch.get_float32_matmul_precision() != "highest"


def compile_cache() -> str:
    """The folder torch's compiler keeps its compiled code in, for later runs (TORCHINDUCTOR_CACHE_DIR, else under
    the machine's temporary folder: on a cluster node often wiped with each job)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()
