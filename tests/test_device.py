"""Where models run (rlsteps.engine.device): the device asked for, and where torch keeps what it compiles."""

import pytest
import torch

from rlsteps.engine.device import compile_cache, resolve_device


def test_auto_is_the_gpu_when_there_is_one_and_cuda_without_one_is_a_clear_error():
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device is visible; use cpu or auto"):
            resolve_device("cuda:0")


def test_the_compile_cache_is_where_torchinductor_cache_dir_says(monkeypatch, tmp_path):
    """The folder a compiled run names (train.compile, the compiled sampler) is the one torch's compiler uses."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert compile_cache() == str(tmp_path / "inductor")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert compile_cache() != str(tmp_path / "inductor")
