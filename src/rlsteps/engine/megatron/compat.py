"""Running megatron-core's checkpointing (and, for checks, its GPTModel) in one process without CUDA.

megatron-core is written for CUDA ranks. Its dist_checkpointing save and load work on the CPU with a
one-rank gloo group once two CUDA calls stop failing; GPTModel needs one more. Every patch here is
applied only while CUDA is absent, only inside `megatron_runtime()`, and undone on exit:

- `torch.cuda.synchronize`: a no-op (the checkpoint writer calls it before and after writing);
- `torch.cuda.current_device`: answers "cpu" (the writer builds a small flag tensor on that device);
- the model-parallel RNG tracker's `fork()`: a plain context (it swaps CUDA RNG states around dropout;
  on CUDA the tracker is seeded instead, see `gpt_model_runtime`).

Without Transformer Engine, megatron-core 0.16.1's MoE router (moe_utils.RouterGatingLinearFunction) reads
`te_general_gemm`, a name its module defines only where Transformer Engine imports (a NameError otherwise): inside
`gpt_model_runtime` the name is None where it is missing, which is the router's own fallback (a plain matmul).

With CUDA present nothing is patched. What needs a GPU regardless: Transformer Engine layer specs,
fused kernels, and any tensor or pipeline parallelism above one rank.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import queue
import warnings
from collections.abc import Iterator
from types import ModuleType

import torch

INSTALL_HINT = "pip install 'rlsteps[megatron]' (megatron-core and psutil)"


class MegatronUnavailable(ImportError):
    """megatron-core (or psutil, which its checkpoint writer needs) is not installed."""


def import_megatron(module: str = "megatron.core.dist_checkpointing") -> ModuleType:
    """Import a megatron-core module quietly (it warns at import that Transformer Engine and Apex are absent)."""
    logging.getLogger("megatron").setLevel(logging.WARNING)  # its INFO lines (FSDP detection, timings) are not ours
    try:
        importlib.import_module("psutil")
        with warnings.catch_warnings(), _fusions_uncompiled():
            warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex|apex|transformer_engine).*")
            warnings.filterwarnings("ignore", category=FutureWarning, module="megatron")
            return importlib.import_module(module)
    except ImportError as error:
        raise MegatronUnavailable(f"Megatron checkpoints need megatron-core: {INSTALL_HINT} ({error})") from error


@contextlib.contextmanager
def _fusions_uncompiled() -> Iterator[None]:
    """megatron-core's first import without torch.compile: its fused kernels (bias-GeLU, SwiGLU, ...) are wrapped
    at import by `megatron.core.jit.jit_fuser`, torch.compile, whose first call imports torch._dynamo and inductor
    (5 of megatron-core's 5.5 s of import on two cores, measured; inductor's part even where torch._dynamo is
    imported already). Checkpoints call none of them; with a plain decorator they are megatron-core's own
    `disable_jit_fuser()` mode (the unfused functions, the same results). Once megatron-core is imported, nothing
    is patched."""
    import sys

    if "megatron.core" in sys.modules:
        yield
        return
    compile_ = torch.compile
    torch.compile = _plain_decorator
    try:
        yield
    finally:
        torch.compile = compile_


def _plain_decorator(model=None, **_options):
    """torch.compile's two call forms (`@torch.compile`, `@torch.compile(...)`), compiling nothing."""
    return model if model is not None else (lambda function: function)


def require_megatron() -> None:
    """MegatronUnavailable unless megatron-core and psutil are installed; imports neither (that takes seconds)."""
    missing = [name for name in ("megatron.core", "psutil") if importlib.util.find_spec(name) is None]
    if missing:
        raise MegatronUnavailable(f"Megatron checkpoints need megatron-core: {INSTALL_HINT} (no {', '.join(missing)})")


@contextlib.contextmanager
def megatron_runtime() -> Iterator[None]:
    """A one-rank process group (unless one exists) and, without CUDA, the CPU patches above."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=".*load_state_dict. is deprecated.*", category=FutureWarning)
        if not torch.cuda.is_available():
            stack.enter_context(_cpu_patches())
        stack.enter_context(_single_rank_group())
        yield


@contextlib.contextmanager
def in_process_write_results() -> Iterator[None]:
    """A synchronous dist_checkpointing.save without the Manager process megatron-core starts for it.

    Its writer collects the write results through a queue it creates once in a *spawned* multiprocessing
    Manager (a fresh Python: about 4 s on a first save on two cores, and 2 s more at exit), though a
    synchronous save puts and gets them in this same process. A plain queue serves (0.2 s for the tiny
    policy's first save against 4.5 s). An asynchronous save, which rlsteps does not use, would need theirs."""
    writer = import_megatron("megatron.core.dist_checkpointing.strategies.filesystem_async")
    with _buckets_written_here(writer):
        if not hasattr(writer, "_results_queue") or writer._results_queue is not None:
            yield  # another megatron-core layout, or its queue already made: leave it as it is
            return
        writer._results_queue = queue.Queue()
        try:
            yield
        finally:
            writer._results_queue = None


@contextlib.contextmanager
def _buckets_written_here(writer: ModuleType) -> Iterator[None]:
    """The synchronous save's files written by this process, one after another, not by a forked process per file.

    megatron-core's writer forks a process per file (two by default) for each save and joins them; forking the
    training process (its whole address space, on a loaded CPU) costs more than writing the tiny policy's few MB
    (0.4 s of 0.6 s per save, measured). Each file is written by the same function with the same arguments
    (fsync included) and its results or exception collected as the forked path collects them."""
    cls = getattr(writer, "FileSystemWriterAsync", None)
    forked = vars(cls).get("write_preloaded_data_multiproc") if cls is not None else None  # the staticmethod
    if forked is None or not hasattr(cls, "write_preloaded_data"):
        yield  # another megatron-core layout: leave it as it is
        return

    def write_here(transform_list, use_msc, rank, write_buckets, global_results_queue) -> None:
        results, done = queue.Queue(), queue.Queue()
        outcome: dict | Exception = {}
        for i, bucket in enumerate(write_buckets):
            done.put(i)
            kwargs = {"use_msc": use_msc} if use_msc else {}
            cls.write_preloaded_data(transform_list, i, bucket, results, done, True, **kwargs)
            index, written = results.get()
            if isinstance(written, Exception):
                outcome = written
                break
            outcome[index] = written
        global_results_queue.put(outcome)

    cls.write_preloaded_data_multiproc = staticmethod(write_here)
    try:
        yield
    finally:
        cls.write_preloaded_data_multiproc = forked


@contextlib.contextmanager
def _single_rank_group() -> Iterator[None]:
    import torch.distributed as dist

    if dist.is_initialized():  # under torchrun, or a caller's own group: use it as it is
        yield
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _cpu_patches() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(torch.cuda, "synchronize", lambda *args, **kwargs: None))
        stack.enter_context(_patched(torch.cuda, "current_device", lambda: "cpu"))
        yield


@contextlib.contextmanager
def _patched(owner: object, name: str, replacement: object) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def _name_defined(module: ModuleType, name: str) -> Iterator[None]:
    """`module.name` is None while open, where the module does not define it."""
    if hasattr(module, name):
        yield
        return
    setattr(module, name, None)
    try:
        yield
    finally:
        delattr(module, name)


@contextlib.contextmanager
def gpt_model_runtime(seed: int = 0) -> Iterator[None]:
    """One model-parallel rank (TP = PP = 1) with the RNG tracker GPTModel forks around its dropout, ready.

    On CUDA the tracker is seeded as Megatron seeds it (`model_parallel_cuda_manual_seed`, after model-parallel
    init); without CUDA it has no CUDA states to fork, so `fork()` becomes a plain context."""
    parallel_state = import_megatron("megatron.core.parallel_state")
    random = import_megatron("megatron.core.tensor_parallel.random")
    moe_utils = import_megatron("megatron.core.transformer.moe.moe_utils")
    with megatron_runtime(), _name_defined(moe_utils, "te_general_gemm"):
        parallel_state.initialize_model_parallel(1, 1)
        try:
            if torch.cuda.is_available():
                random.model_parallel_cuda_manual_seed(seed)
                yield
            else:
                with _patched(random.get_cuda_rng_tracker(), "fork", lambda *args, **kwargs: contextlib.nullcontext()):
                    yield
        finally:
            parallel_state.destroy_model_parallel()
