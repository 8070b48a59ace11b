"""The GPU work of a NeMo-RL run, stood in where NeMo-RL looks it up, so that its own driver, setup and GRPO step
run on a CPU (tests/nemo_rl_run.py): vLLM's engine (nemo_rl_standin_vllm), the policy workers' forward and backward
(nemo_rl_standin_policy), NeMo-Gym's server processes (nemo_rl_standin_gym), the GPU's own answers to torch.cuda's
queries, and three steps that act on the machine (binding a process to a GPU's NUMA node, patching vLLM's installed
files, building the workers' uv environments). Ray's processes and GPU bundles are tests/standin_ray.py's, or a real
Ray's (tests/nemo_rl_real_ray.py), in whose every worker process these are installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from nemo_rl_standin_gym import gym_stand_ins
from nemo_rl_standin_policy import policy_worker_class
from nemo_rl_standin_vllm import VLLM, async_generation_worker

POLICY_WORKERS = {  # the modules NeMo-RL's Policy imports its workers from: (class name, backend)
    "nemo_rl.models.policy.workers.dtensor_policy_worker": ("DTensorPolicyWorker", "dtensor"),
    "nemo_rl.models.policy.workers.dtensor_policy_worker_v2": ("DTensorPolicyWorkerV2", "dtensor_v2"),
    "nemo_rl.models.policy.workers.megatron_policy_worker": ("MegatronPolicyWorker", "megatron"),
}
H100 = types.SimpleNamespace(
    name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 * 1024**3, multi_processor_count=132
)


def report_gpus(gpus_per_node: int) -> None:
    """torch.cuda's queries answered as a node of H100s would (what NeMo-RL reads: capability, name, memory), and
    `.cuda()` keeps a tensor where it is (the CPU is this GPU); torch.cuda.is_available() stays False."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    cuda = torch.cuda
    cuda.get_device_capability = lambda device=None: (H100.major, H100.minor)
    cuda.get_device_name = lambda device=None: H100.name
    cuda.get_device_properties = lambda device=None: H100
    cuda.device_count = lambda: gpus_per_node
    cuda.current_device = lambda: 0
    cuda.set_device = lambda device: None
    cuda.mem_get_info = lambda device=None: (H100.total_memory * 3 // 4, H100.total_memory)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(cuda, name, lambda device=None: 0)
    cuda.reset_peak_memory_stats = lambda device=None: None
    cuda.synchronize = lambda device=None: None
    cuda.nvtx.range_push = cuda.nvtx.range_pop = lambda *args, **kwargs: None  # profiler markers


def replace(module: types.ModuleType, name: str, stand_in: Any) -> None:
    """module.name replaced, in the module and wherever NeMo-RL's or NeMo-Gym's modules imported it by name."""
    original = getattr(module, name)
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith(("nemo_rl", "nemo_gym")) and vars(loaded).get(name) is original:
            setattr(loaded, name, stand_in)


def automodel_absent() -> None:
    """Automodel (not installed off a GPU) served inert, for nemo_rl.models.automodel.setup, which the DTensor v2
    stand-in imports for its config checks (validate_and_prepare_config). The inert module lacks
    NeMoAutoModelForTokenClassification: the setup module backports that class, and stops (a tripwire) where
    Automodel exports it, as NeMo-RL's pinned Automodel does not."""
    import upstream

    class WithoutTokenClassification(type(upstream.inert_module("nemo_automodel"))):
        def __getattr__(self, name: str):
            if name == "NeMoAutoModelForTokenClassification":
                raise AttributeError(name)
            return super().__getattr__(name)

    sys.modules["nemo_automodel"] = WithoutTokenClassification("nemo_automodel")
    sys.modules["nemo_automodel"].__path__ = []
    sys.modules["nemo_automodel.NeMoAutoModelForTokenClassification"] = None  # not a submodule either


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs an action on a module once it is imported, or serves a stand-in module in its place: each stand-in is
    installed in a process only where NeMo-RL's code there imports what it replaces (a real Ray worker imports no
    more than its actor needs)."""

    def __init__(self) -> None:
        self.after: dict[str, Callable[[types.ModuleType], None]] = {}
        self.instead: dict[str, Callable[[], types.ModuleType]] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.instead:
            return importlib.machinery.ModuleSpec(fullname, _Served(self.instead.pop(fullname)))
        if fullname not in self.after:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None:
            action, exec_module = self.after.pop(fullname), spec.loader.exec_module

            def exec_then_act(module: types.ModuleType) -> None:
                exec_module(module)
                action(module)

            spec.loader.exec_module = exec_then_act
        return spec


class _Served(importlib.abc.Loader):
    def __init__(self, build: Callable[[], types.ModuleType]) -> None:
        self.build = build

    def create_module(self, spec):
        return self.build()

    def exec_module(self, module) -> None:
        return None


_HOOKS = _AfterImport()


def after_import(name: str, action: Callable[[types.ModuleType], None]) -> None:
    if name in sys.modules:
        action(sys.modules[name])
    else:
        _HOOKS.after[name] = action


def served_instead(name: str, build: Callable[[], types.ModuleType]) -> None:
    if name in sys.modules:
        sys.modules[name] = build()
    else:
        _HOOKS.instead[name] = build


def policy_worker_module(module_name: str) -> Callable[[], types.ModuleType]:
    def build() -> types.ModuleType:
        import ray

        class_name, backend = POLICY_WORKERS[module_name]
        module = types.ModuleType(module_name)
        setattr(module, class_name, ray.remote(type(class_name, (policy_worker_class(),), {"backend": backend})))
        return module

    return build


def vllm_worker_stood_in(module: types.ModuleType) -> None:
    """NeMo-RL's vLLM worker module: its patching of vLLM's installed files skipped, its worker on the stand-in
    engine."""
    import ray

    replace(module, "_apply_vllm_patches", lambda *args, **kwargs: None)
    module.VllmGenerationWorker = ray.remote(module.VllmGenerationWorkerImpl)


def async_vllm_worker_stood_in(module: types.ModuleType) -> None:
    import ray

    module.VllmAsyncGenerationWorker = ray.remote(async_generation_worker(module.VllmAsyncGenerationWorkerImpl))


def gym_server_runner_stood_in(module: types.ModuleType) -> None:
    module.RunHelper = gym_stand_ins()[0]


def gym_rollouts_stood_in(module: types.ModuleType) -> None:
    module.RolloutCollectionHelper = gym_stand_ins()[1]


def install() -> None:
    """The stand-ins in place (with NeMo-RL importable, over the in-process Ray or in a real Ray's worker; report_gpus
    follows per case), each as NeMo-RL's code imports what it replaces."""
    import nemo_rl.distributed.numa_utils as numa
    import nemo_rl.utils.venvs as venvs

    import upstream

    for module_name, names in VLLM.items():
        vars(sys.modules.setdefault(module_name, upstream.inert_module(module_name))).update(names)
    automodel_absent()
    replace(numa, "bind_to_gpu_numa", lambda *args, **kwargs: None)
    replace(venvs, "create_local_venv_on_each_node", lambda py_executable, venv_name: sys.executable)
    if _HOOKS not in sys.meta_path:
        sys.meta_path.insert(0, _HOOKS)
    for module_name in POLICY_WORKERS:
        served_instead(module_name, policy_worker_module(module_name))
    after_import("nemo_rl.models.generation.vllm.vllm_worker", vllm_worker_stood_in)
    after_import("nemo_rl.models.generation.vllm.vllm_worker_async", async_vllm_worker_stood_in)
    after_import("nemo_gym.cli", gym_server_runner_stood_in)
    after_import("nemo_gym.rollout_collection", gym_rollouts_stood_in)
