"""Megatron-Bridge 0.6.2's own code, run here (Python 3.11, no GPU): one command, one JSON line on stdout.

    provider HF_DIR             the GPTModelProvider Bridge builds from a Hugging Face config
                                (AutoBridge.from_hf_config)
    load ITER_DIR               what Bridge's loaders make of a checkpoint's iter folder: ConfigContainer.from_yaml in
                                STRICT mode (as NeMo-RL's Megatron setup calls it), load_model_config (what
                                AutoBridge.load_megatron_model and export_ckpt instantiate), the run_config fields its
                                checkpoint loading reads, and its train-state files
    write HF_DIR OUT_YAML       run_config.yaml as Bridge writes it for an imported model (save_megatron_model's
                                ConfigContainer, serialised by ConfigContainer.to_yaml)
    export ROOT HF_DIR OUT_DIR  AutoBridge.export_ckpt of a checkpoint root to a Hugging Face folder, as Bridge runs
                                it: on a machine without Transformer Engine it stops where it builds the model
    export_cpu ROOT HF_DIR OUT_DIR TOKENS
                                the same export with the model built for a CPU (cpu_build), and the logits of the
                                GPTModel Bridge loaded on TOKENS (JSON, [batch][positions]), saved to OUT_DIR.pt
    names HF_DIR NAMES          Bridge's mapping registry for the model: each Megatron parameter name (a JSON list)
                                -> the Hugging Face names it maps to
    batch JSON                  several of these, Bridge imported once

The unpacked wheels come first on sys.path (RLSTEPS_MEGATRON_BRIDGE_ROOTS, from tests/megatron_bridge.py). Stand-ins,
each for an import Bridge or megatron-core makes unguarded: Triton kernels (Mamba's SSD ops, MoE paged stash), and
Transformer Engine, einops, NVIDIA ModelOpt, torch's TensorBoard writer, megatron.energon and transformers modules
newer than Bridge's pin, which Bridge's other model families import; the third-party stand-ins leave sys.modules once
Bridge is imported, so megatron-core's guarded imports still find no Transformer Engine. typing.override (Python 3.12)
is typing_extensions's.

Bridge's export builds the model its checkpoint's provider describes, and for a Llama or Qwen2 model that provider
(as Bridge's own import writes it) asks for Transformer Engine twice: its default layer spec is Transformer Engine's
(megatron-core's TESpecProvider, None without it: "'NoneType' object is not callable"), and apply_rope_fusion makes
TransformerConfig.__post_init__ look for Transformer Engine's fused RoPE ("apply_rope_fusion is not available.
Please install TE >= 1.4."). export_cpu builds it instead with Bridge's own local layer spec (the names Bridge's
Llama and Qwen2 mappings list as the local implementation) and with the three fusions off that need CUDA kernels
(persist_layer_norm: an assert in megatron-core's torch norm; gradient_accumulation_fusion: APEX's CUDA extension).
None of these changes which tensors the checkpoint holds or how Bridge maps them: the sharded state dict of the local
spec has the Transformer Engine spec's keys. Its forward pass on a CPU needs two CUDA calls answered (the rotary
embedding's torch.cuda.current_device and the RNG tracker's fork around dropout), only while it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib.machinery
import json
import os
import sys
import types
import typing
from pathlib import Path

import torch
import typing_extensions

sys.path[:0] = os.environ["RLSTEPS_MEGATRON_BRIDGE_ROOTS"].split(os.pathsep)
sys.path.insert(0, str(Path(__file__).resolve().parent))
typing.override = typing_extensions.override

import upstream  # noqa: E402  (its inert stand-ins)

STUBBED_MODULES = ("megatron.core.transformer.moe.ops.paged_stash", "megatron.core.ssm.ops", "megatron.energon")
STUBBED_FOR_BRIDGE = ("transformer_engine", "einops", "modelopt", "torch.utils.tensorboard")  # unguarded in Bridge
MISSING_SUBMODULES_OF = frozenset({"transformers"})  # modules of a newer transformers than Bridge pins


def _importer() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("importlib", "_frozen_importlib", __name__, "upstream")):
            return module
        frame = frame.f_back
    return ""


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


class _Finder(upstream._StandInFinder):
    def __init__(self, last: bool) -> None:
        super().__init__(frozenset(), fallback=last)

    def find_spec(self, fullname, path=None, target=None):
        top, importer = fullname.partition(".")[0], _importer()
        if self.fallback:  # at the end of sys.meta_path: nothing else found it
            wanted = "." in fullname and top in MISSING_SUBMODULES_OF and importer.startswith("megatron.bridge.")
        else:
            by_bridge = importer.startswith("megatron.bridge.") and importer != "megatron.bridge.utils.import_utils"
            wanted = _under(fullname, STUBBED_MODULES) or (_under(fullname, STUBBED_FOR_BRIDGE) and by_bridge)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True) if wanted else None


def import_bridge() -> None:
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    sys.meta_path.insert(0, _Finder(last=False))
    sys.meta_path.append(_Finder(last=True))
    import megatron.bridge  # noqa: F401
    import megatron.bridge.training.config  # noqa: F401
    import megatron.bridge.training.model_load_save  # noqa: F401

    for name in [n for n, m in sys.modules.items() if isinstance(m, upstream._InertModule)]:
        if not name.startswith("megatron.") and name != "torch.utils.tensorboard":
            del sys.modules[name]


def plain(value):
    """A provider's field value as JSON: functions and classes by their dotted name, dtypes and enums by str."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, (torch.dtype, enum.Enum, Path)):
        return str(value)
    return repr(value)


def provider_fields(provider) -> dict:
    fields = {f.name: getattr(provider, f.name) for f in dataclasses.fields(provider) if not f.name.startswith("_")}
    return {"_class_": plain(type(provider)), **plain(fields)}


def hf_bridge(hf_dir: str):
    from megatron.bridge import AutoBridge
    from transformers import AutoConfig

    return AutoBridge.from_hf_config(AutoConfig.from_pretrained(hf_dir))


def cmd_provider(hf_dir: str) -> dict:
    return provider_fields(hf_bridge(hf_dir).to_megatron_provider(load_weights=False))


def cmd_load(iter_dir: str) -> dict:
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.model_load_save import load_model_config
    from megatron.bridge.training.utils.checkpoint_utils import read_run_config, read_train_state
    from megatron.bridge.utils.instantiate_utils import InstantiationMode

    run_config = Path(iter_dir) / "run_config.yaml"
    container = ConfigContainer.from_yaml(str(run_config), mode=InstantiationMode.STRICT)
    model_cfg, mlm_args = load_model_config(iter_dir)
    raw = read_run_config(str(run_config))
    train_states = {}
    for name, path in (("train_state", Path(iter_dir) / "train_state.pt"),
                       ("latest_train_state", Path(iter_dir).parent / "latest_train_state.pt")):  # fmt: skip
        if path.is_file():
            state = read_train_state(str(path))
            train_states[name] = {"step": state.step, "consumed_train_samples": state.consumed_train_samples}
    return {
        "container": plain(type(container)),
        "strict": provider_fields(container.model),
        "load_model_config": provider_fields(model_cfg),
        "mlm_args": mlm_args is not None,
        "tp_pp": [raw["model"]["tensor_model_parallel_size"], raw["model"]["pipeline_model_parallel_size"]],
        "checkpoint": {key: raw["checkpoint"][key] for key in ("save_rng", "save_optim", "fully_parallel_save")},
        "checkpoint_format": container.checkpoint.ckpt_format,
        "train_states": train_states,
    }


def cmd_write(hf_dir: str, out: str) -> dict:
    """save_megatron_model's container (megatron/bridge/training/model_load_save.py) for the imported model."""
    from megatron.bridge.training.config import CheckpointConfig, ConfigContainer, LoggerConfig, OptimizerConfig

    provider = hf_bridge(hf_dir).to_megatron_provider(load_weights=False)
    container = ConfigContainer(
        model=provider, train=None, optimizer=OptimizerConfig(use_distributed_optimizer=False), ddp=None,
        scheduler=None, dataset=None, logger=LoggerConfig(), tokenizer=None,
        checkpoint=CheckpointConfig(async_save=False, save=str(Path(out).parent), save_optim=False, save_rng=False,
                                    ckpt_format="torch_dist", dist_ckpt_optim_fully_reshardable=True),
        dist=None,
    )  # fmt: skip
    container.to_yaml(out)
    return {"written": out}


def cmd_export(root: str, hf_dir: str, out: str) -> dict:
    hf_bridge(hf_dir).export_ckpt(root, out, show_progress=False)
    return {"exported": out}


CPU_BUILD_OFF = ("apply_rope_fusion", "persist_layer_norm", "gradient_accumulation_fusion")
# An MoE model on a CPU: no fused permutation (Transformer Engine's), and the all-gather token dispatcher (the
# all-to-all one makes a CUDA stream when it is built). Neither changes a tensor or its name.
CPU_BUILD_MOE = {"moe_permute_fusion": False, "moe_token_dispatcher_type": "allgather"}
# Each GPTModel built sets these for Transformer Engine from its attention backend, and asserts that an earlier one in
# the process did not set them otherwise: each export starts without them, as in a process of its own.
ATTENTION_BACKEND_VARIABLES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


def cpu_layer_spec(config):
    """Bridge's local layer spec, whose checkpoint keys are the Transformer Engine spec's: for a dense layer as it is;
    for an MoE layer without the local spec's renaming of pre_mlp_layernorm into mlp.linear_fc1 (there is no fc1 to
    fuse it into: the Transformer Engine spec keeps it as `pre_mlp_layernorm`, and so does Bridge's mapping)."""
    from megatron.bridge.models.gpt_provider import local_layer_spec

    spec = local_layer_spec(config)
    if not config.num_moe_experts:
        return spec
    keys = {k: v for k, v in spec.submodules.sharded_state_dict_keys_map.items() if k != "pre_mlp_layernorm."}
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, sharded_state_dict_keys_map=keys))


@contextlib.contextmanager
def cpu_build():
    """While open, the provider Bridge's load_megatron_model reads from a checkpoint builds its GPTModel on a CPU:
    Bridge's local layer spec (cpu_layer_spec), the fusions of CPU_BUILD_OFF off, an MoE model as CPU_BUILD_MOE
    says, the local attention backend where the provider asks for flash attention. What it changed is recorded in
    the yielded dict."""
    from megatron.bridge.training import model_load_save
    from megatron.core.transformer.enums import AttnBackend

    read = model_load_save.load_model_config
    changed = {}

    def for_the_cpu(checkpoint_path):
        model_cfg, mlm_args = read(checkpoint_path)
        changed["transformer_layer_spec"] = [plain(model_cfg.transformer_layer_spec), plain(cpu_layer_spec)]
        model_cfg.transformer_layer_spec = cpu_layer_spec
        settings = dict.fromkeys(CPU_BUILD_OFF, False) | (CPU_BUILD_MOE if model_cfg.num_moe_experts else {})
        if model_cfg.attention_backend == AttnBackend.flash:  # flash attention is a CUDA kernel (Gemma 3 asks for it)
            settings["attention_backend"] = AttnBackend.local
        for name, value in settings.items():
            changed[name] = [plain(getattr(model_cfg, name)), plain(value)]
            setattr(model_cfg, name, value)
        return model_cfg, mlm_args

    model_load_save.load_model_config = for_the_cpu
    backends = {name: os.environ.pop(name, None) for name in ATTENTION_BACKEND_VARIABLES}
    try:
        yield changed
    finally:
        model_load_save.load_model_config = read
        os.environ.update({name: value for name, value in backends.items() if value is not None})


@contextlib.contextmanager
def cuda_calls_answered():
    """For a forward pass on a CPU: torch.cuda.current_device answers "cpu" (the rotary embedding moves its
    frequencies there) and the RNG tracker's fork is a plain context (there are no CUDA RNG states to swap)."""
    from megatron.core.tensor_parallel import random

    tracker = random.get_cuda_rng_tracker()
    current_device, fork = torch.cuda.current_device, tracker.fork
    torch.cuda.current_device = lambda: "cpu"
    tracker.fork = lambda *args, **kwargs: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.cuda.current_device, tracker.fork = current_device, fork


def cmd_export_cpu(root: str, hf_dir: str, out: str, tokens: str) -> dict:
    """export_ckpt, unchanged, with the model built for a CPU; the GPTModel it loads (inside export_ckpt's own
    distributed context) also runs on `tokens`, and its logits are saved to OUT.pt."""
    bridge = hf_bridge(hf_dir)
    load = bridge.load_megatron_model
    ids = torch.tensor(json.loads(tokens))
    logits_path = f"{out}.pt"
    built = {}

    def load_and_run(*args, **kwargs):
        model = load(*args, **kwargs)
        gpt = model[0]
        built["model_class"] = [
            plain(type(module)) for module in (gpt, getattr(gpt, "module", None)) if module is not None
        ]
        batch, length = ids.shape
        causal = torch.triu(torch.ones(1, 1, length, length, dtype=torch.bool), diagonal=1)  # True = masked
        gpt.eval()
        with torch.no_grad(), cuda_calls_answered():
            logits = gpt(ids, torch.arange(length).expand(batch, length), attention_mask=causal)
        torch.save(logits.float(), logits_path)
        return model

    bridge.load_megatron_model = load_and_run
    with cpu_build() as changed:
        bridge.export_ckpt(root, out, show_progress=False)
    return {"exported": out, "logits": logits_path, "cpu_build": changed, **built}


def cmd_names(hf_dir: str, names: str) -> dict:
    """Bridge's mapping registry for the model of `hf_dir`: each Megatron parameter name (JSON list) -> the Hugging
    Face names Bridge maps it to (a list), or null where Bridge has no mapping for it."""
    registry = hf_bridge(hf_dir)._model_bridge.mapping_registry()
    out = {}
    for name in json.loads(names):
        mapping = registry.megatron_to_hf_lookup(name)
        hf = None if mapping is None else mapping.hf_param
        out[name] = None if hf is None else sorted(hf.values()) if isinstance(hf, dict) else [hf]
    return out


COMMANDS = {
    "provider": cmd_provider,
    "names": cmd_names,
    "load": cmd_load,
    "write": cmd_write,
    "export": cmd_export,
    "export_cpu": cmd_export_cpu,
}


def main() -> None:
    """`COMMAND ARGS...`, or `batch JSON` with a list of [COMMAND, ARGS...]: Bridge is imported once (15 s on two
    cores) and each answer is {"ok": ...} or {"error": the exception, as Bridge raised it}."""
    command, *args = sys.argv[1:]
    import_bridge()
    if command != "batch":
        answer = COMMANDS[command](*args)
    else:
        answer = []
        for name, *item_args in json.loads(args[0]):
            try:
                answer.append({"ok": COMMANDS[name](*item_args)})
            except Exception as error:  # what Bridge says, for the test to show
                answer.append({"error": f"{type(error).__name__}: {error}"})
    sys.stdout.write("\n" + json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
