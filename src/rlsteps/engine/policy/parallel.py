"""How the policy is laid out over the run's processes and in what precision it computes.

- Precision: `run.dtype=bfloat16` computes in bf16 while the weights the optimizer updates, and its state,
  stay fp32 (master weights). One process runs its forward passes under torch.autocast; several processes
  get the same from FSDP2's MixedPrecisionPolicy (bf16 parameters gathered for compute, fp32 gradient
  reduction, fp32 shards updated). Pure bf16 weights would lose every update smaller than 2^-8 of a weight:
  at lr 1e-6, almost all of them.
- Several processes: every decoder layer and the root model are sharded with FSDP2 (`fully_shard`), the
  policy and the frozen reference alike. Generation and the no-grad log-prob passes run with the parameters
  gathered once (`gathered`), since the processes run a different number of forward passes there;
  training runs sharded, layer by layer.
- One process: the reference is a frozen copy in the compute dtype, on the device or (run.offload_reference)
  in CPU memory, moved onto the device for its pass only.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from rlsteps.contract.config import LoraConfig
from rlsteps.engine.distributed import World


@dataclass(frozen=True)
class Precision:
    compute: torch.dtype = torch.float32  # what matmuls run in; weights and optimizer state are always fp32

    @classmethod
    def named(cls, dtype: str) -> Precision:
        return cls(torch.bfloat16 if dtype == "bfloat16" else torch.float32)

    @property
    def mixed(self) -> bool:
        return self.compute != torch.float32

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """bf16 compute over fp32 weights (in one process; over FSDP2's gathered bf16 parameters it changes
        nothing but the few ops autocast runs in fp32); nothing to do in fp32."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.compute)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks a Hugging Face model names in `_no_split_modules` (Qwen2DecoderLayer, GPT2Block...)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder layer class (_no_split_modules), so it cannot be sharded "
            "layer by layer; run it in one process"
        )
    return layers


def shard(model: nn.Module, world: World, device: torch.device, precision: Precision) -> nn.Module:
    """FSDP2 over the world's processes: each decoder layer, then the root (embeddings, final norm, head)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world.size,))
    mixed = MixedPrecisionPolicy(param_dtype=precision.compute if precision.mixed else None, reduce_dtype=torch.float32)
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mixed)
    fully_shard(model, mesh=mesh, mp_policy=mixed)
    return model


def place_policy(
    model: nn.Module, world: World, device: torch.device, precision: Precision, activation_checkpointing: bool
) -> nn.Module:
    """The trained policy: fp32 weights, sharded over several processes or on the device of one."""
    model = model.float()
    if activation_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers' newer name
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False  # generation asks for the cache itself
    if world.is_distributed:
        return shard(model, world, device, precision)
    return model.to(device)


def reference_copy(
    model: nn.Module, world: World, device: torch.device, precision: Precision, offload: bool
) -> nn.Module:
    """The frozen initial policy: sharded like the policy, or one copy in the compute dtype (in CPU memory when
    offloaded). Taken before the policy is placed, so the run never holds a third copy."""
    frozen = copy.deepcopy(model).requires_grad_(False).eval()
    if world.is_distributed:
        return shard(frozen, world, device, precision)
    return frozen.to(device="cpu" if offload else device, dtype=precision.compute)


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """The model whole for the block: sharded parameters gathered once and kept (each process may then run any
    number of forward passes), or an offloaded model moved onto the device; as it was afterwards."""
    sharded = _fsdp_modules(model)
    if sharded:
        for module in sharded:
            module.set_reshard_after_forward(False)
        model.unshard()
        try:
            yield model
        finally:
            model.reshard()
            for module in sharded:
                module.set_reshard_after_forward(True)
        return
    home = next(model.parameters()).device
    if home == device:
        yield model
        return
    model.to(device)
    try:
        yield model
    finally:
        model.to(home)


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Reduce-scatter gradients after the next backward (the last micro-batch of an optimizer step), or keep
    accumulating them unsharded (the others): one reduction per optimizer step, not one per micro-batch."""
    for module in _fsdp_modules(model):
        module.set_requires_gradient_sync(enabled, recurse=False)


def full_state_on_main(model: nn.Module, world: World) -> dict[str, torch.Tensor] | None:
    """Every weight whole, in CPU memory, on the main process (None elsewhere): what the output artifact needs."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not world.is_distributed:
        return None
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return state if world.is_main else None


def unsharded_copy(
    initial_policy: str | Path, state: dict[str, torch.Tensor], lora: LoraConfig | None = None, seed: int = 0
) -> nn.Module:
    """A plain model from the initial policy's architecture (with the run's adapters, under LoRA) with the trained
    weights (main process, CPU)."""
    from rlsteps.engine.policy.model import load_policy

    model, _ = load_policy(initial_policy, device="cpu", dtype=torch.float32)
    if lora is not None:
        from rlsteps.engine.policy.lora import apply_lora

        model = apply_lora(model, lora, seed)
    result = model.load_state_dict(state, strict=False)  # tied weights may appear under one name only
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {params[name].data_ptr() for name in state if name in params}
    untrained = [name for name in result.missing_keys if name not in params or params[name].data_ptr() not in loaded]
    if untrained or result.unexpected_keys:
        raise RuntimeError(
            f"the gathered weights do not fit {initial_policy}'s architecture (missing {untrained[:5]}, unexpected "
            f"{result.unexpected_keys[:5]}); the output would hold untrained weights, so none is written"
        )
    return model
