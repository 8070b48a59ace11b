"""Low-rank adapters on the policy (train.lora), through peft.

- Only the adapters train: the base weights are frozen, so the optimizer holds the adapters alone and a step
  checkpoint holds the adapters and their optimizer state (train_state leaves frozen parameters out).
- The reference policy is the policy itself with its adapters switched off (`adapters_off`): no second copy.
- A sampler that holds its own weights (vLLM) is sent the merged ones, W + (alpha / dim) B A per adapted layer
  (`merged_parameters`), under the base model's names; the built-in sampler samples from the adapted policy itself.
- The run's output is the merged model (`merged_model`), and beside it the adapters as peft saves them
  (`save_adapter`).
- With train.lora.target_modules empty, the adapters go on the attention and MLP projections, and on a Mamba layer's
  in_proj (`default_target_modules`): every nn.Linear but the output layer, a mixture of experts' router (it picks
  the experts, not what they compute) and a Mamba layer's out_proj, which its fused kernels read as a bare weight
  (peft refuses it). The experts of a mixture that transformers stores fused, as 3-D parameters (Qwen3-MoE), are no
  nn.Linear and keep their weights: their layers train through the attention's adapters.

The adapters' A matrices are drawn from the run's seed (B starts at zero, so the adapted policy starts as the base):
every process of a run, and a rerun, starts from the same adapters.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from rlsteps.contract.config import LoraConfig
from rlsteps.errors import UsageError

# Mamba layers' modules that peft refuses to adapt (peft.tuners.tuners_utils._check_lora_target_modules_mamba): their
# fused kernels read out_proj's and conv1d's weights without calling them
MAMBA_KERNEL_MODULES = ("out_proj", "conv1d")
# config fields that count a mixture's experts: a linear layer with that many outputs is its router
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
ADAPTER_NAME = "default"  # peft's name for a model's one adapter
ADAPTER_DIR = "adapter"  # <output.dir>/adapter: the adapters as peft saves them, beside the merged policy/
LORA_INSTALL_HINT = "pip install 'rlsteps[lora]' (peft) into the job's Python, or train.lora.enabled=false"


def apply_lora(model: nn.Module, settings: LoraConfig, seed: int) -> nn.Module:
    """The model with adapters on its target modules (a peft model around it); a UsageError naming the model's
    linear layers when the targets match none."""
    require_peft()
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=settings.dim,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules) or default_target_modules(model),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # the run's own random state does not move
        torch.manual_seed(seed)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")  # peft asks transformers
        try:
            return get_peft_model(model, peft_config)
        except ValueError as error:
            if "not found in the base model" not in str(error) and "Target modules" not in str(error):
                raise
            raise UsageError(
                f"train.lora.target_modules {list(settings.target_modules)} matches no layer of the policy",
                fix=f"name some of its linear layers, e.g. {linear_layer_names(model)[:8]}, or leave the list empty",
            ) from None


def default_target_modules(model: nn.Module) -> list[str]:
    """The adapters' targets when train.lora.target_modules is empty: the last name of each kind of linear layer but
    the output layer, a router and a Mamba layer's kernel-read out_proj (the module docstring)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    experts = _expert_count(getattr(model, "config", None))
    mamba = _has_mamba_layers(model)
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module is head or module.out_features == experts:
            continue
        last = name.rsplit(".", 1)[-1]
        if not (mamba and last in MAMBA_KERNEL_MODULES):
            names.append(last)
    return list(dict.fromkeys(names))


def _expert_count(config: object) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return next((getattr(text, f) for f in EXPERT_COUNT_FIELDS if getattr(text, f, None)), None)


def _has_mamba_layers(model: nn.Module) -> bool:
    """Whether the model has state-space (Mamba) layers: modules holding an `A_log` parameter (Mamba, Mamba2,
    Nemotron-H, Falcon-H1, Jamba, Bamba)."""
    return any("A_log" in module._parameters for module in model.modules())


def linear_layer_names(model: nn.Module) -> list[str]:
    """The last part of the name of each kind of linear layer in the model, in order (q_proj, k_proj, ...)."""
    return list(dict.fromkeys(name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)))


def has_adapters(model: nn.Module) -> bool:
    """Whether the model is a peft model (a policy with adapters)."""
    peft = sys.modules.get("peft")  # a model with adapters was made by peft: not imported, none has them
    return peft is not None and isinstance(model, peft.PeftModel)


def require_peft() -> None:
    """An ImportError saying what to install, before a LoRA run loads anything, where peft is missing."""
    if importlib.util.find_spec("peft") is None:
        raise ImportError(f"train.lora.enabled needs the peft library, which this Python lacks ({LORA_INSTALL_HINT})")


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[nn.Module]:
    """The base model for the block (the reference policy of a LoRA run): the adapters switched off, then on."""
    with model.disable_adapter():
        yield model


def _lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter whole: a sharded one (DTensor) gathered by every process together."""
    tensor = tensor.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _delta(layer: nn.Module) -> torch.Tensor:
    """(alpha / dim) B A of an adapted layer, in its base weight's layout (transposed for GPT-2's Conv1D)."""
    a = _whole(layer.lora_A[ADAPTER_NAME].weight).float()
    b = _whole(layer.lora_B[ADAPTER_NAME].weight).float()
    delta = (b @ a) * layer.scaling[ADAPTER_NAME]
    return delta.T if getattr(layer, "fan_in_fan_out", False) else delta


def base_name(name: str) -> str:
    """A peft model's parameter name as the base model names it: base_model.model.X.base_layer.weight -> X.weight."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def merged_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(base model's name, whole tensor) per base parameter, each adapted weight with its adapters merged in (fp32
    sum, in the weight's dtype); the adapters themselves are not sent. One parameter whole at a time, gathered in
    the same order on every process."""
    layers = _lora_layers(model)
    for name, parameter in model.named_parameters():
        if ".lora_" in name:
            continue
        tensor = _whole(parameter)
        owner, _, kind = name.rpartition(".base_layer.")
        if kind == "weight" and owner in layers:
            tensor = (tensor.float() + _delta(layers[owner]).to(tensor.device)).to(tensor.dtype)
        yield base_name(name), tensor


def merged_model(model: nn.Module) -> nn.Module:
    """The base model with the adapters merged into its weights (in place): what the output artifact holds."""
    return model.merge_and_unload()


def save_adapter(model: nn.Module, target: Path) -> Path:
    """The adapters as peft saves them (adapter_config.json, adapter_model.safetensors) at `target`, whole or not
    at all: written beside it, then renamed over it."""
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    return target
