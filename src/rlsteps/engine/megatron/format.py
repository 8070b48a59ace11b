"""checkpoint_megatron: read and write Megatron-Core distributed checkpoints (torch_dist) of HF causal LMs.

The folder is laid out as Megatron-Bridge writes an imported model, so Megatron-LM, Megatron-Bridge and
NeMo-RL find what they look for:

    <root>/latest_checkpointed_iteration.txt   the iteration, as Megatron-LM's tracker file
    <root>/iter_0000000/                       megatron.core.dist_checkpointing.save: metadata.json,
                                               common.pt ({checkpoint_version: 3.0, iteration}), .metadata, *.distcp
    <root>/iter_0000000/run_config.yaml        `model:` the Megatron GPT config that rebuilds the model
    <root>/iter_0000000/tokenizer/             the tokenizer, save_pretrained
    <root>/iter_0000000/hf_config/             the Hugging Face config.json (and generation_config.json), so the
                                               model converts back to exactly the same HF model

Tensor names and layouts are in layout.py. Reading accepts the root, or an iter_* folder itself.
"""

from __future__ import annotations

import inspect
import itertools
import json
from pathlib import Path
from typing import Any

import torch

from rlsteps.contract.megatron_files import TOKENIZER_DIR, TRACKER_FILE, find_checkpoint_dir, iteration_folder
from rlsteps.contract.model_families import GPTShape, LayoutError, gpt_shape
from rlsteps.engine.megatron.common_state import load_in_this_process
from rlsteps.engine.megatron.compat import import_megatron, in_process_write_results, megatron_runtime
from rlsteps.engine.megatron.layout import LAYER_PREFIX, expected_shapes, extra_state_keys, to_hf, to_megatron
from rlsteps.engine.megatron.providers import (  # noqa: F401  (vocab_divisor, activation_name: this module's API too)
    activation_name,
    hf_config_from_megatron,
    megatron_model_config,
    target_name,
    vocab_divisor,
)

RUN_CONFIG_FILE = "run_config.yaml"
TRAIN_STATE_FILE = "train_state.pt"  # Megatron-Bridge's TrainState; latest_train_state.pt at the root
BRIDGE_CONFIG = "megatron.bridge.training.config"
HF_CONFIG_DIR = "hf_config"
CHECKPOINT_VERSION = 3.0
PADDED_VOCAB_KEYS = ("embedding.word_embeddings.weight", "output_layer.weight")  # Megatron may pad the vocab rows


def iteration_dir(root: Path, iteration: int) -> Path:
    return root / iteration_folder(iteration)


def resolve_checkpoint_dir(ref: str | Path) -> Path:
    """The dist-checkpoint folder of a checkpoint root (through the tracker file) or of an iter_* folder itself."""
    from fsspec.implementations.local import LocalFileSystem

    found, why_not = find_checkpoint_dir(LocalFileSystem(), str(Path(ref).absolute()))
    if found is None:
        raise ValueError(why_not)
    return Path(found)


# ---------------------------------------------------------------------------------------------
# Writing


def save_megatron_checkpoint(model: Any, tokenizer: Any, root: str | Path, iteration: int = 0) -> Path:
    """Write an HF causal LM (and its tokenizer) as a Megatron-Core distributed checkpoint under `root`.

    Returns the iter_* folder. Raises LayoutError, naming the tensor, for a model the layout does not fit.
    """
    root = Path(root)
    if not model.config.architectures:  # a model built from a config; save_pretrained fills this in the same way
        model.config.architectures = [type(model).__name__]
    hf_config = model.config.to_dict()
    shape = gpt_shape(hf_config)
    tensors = to_megatron(shape, {name: t.detach().cpu() for name, t in model.state_dict().items()})
    target = iteration_dir(root, iteration)
    target.mkdir(parents=True, exist_ok=False)  # dist_checkpointing.save wants an empty folder
    state = {"model": _sharded_model(shape, tensors), "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration}
    _dist_save(state, target)
    _write_run_config(target / RUN_CONFIG_FILE, shape, hf_config, model.dtype)
    _write_train_state(root, target, iteration)
    model.config.save_pretrained(target / HF_CONFIG_DIR)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(target / HF_CONFIG_DIR)
    tokenizer.save_pretrained(target / TOKENIZER_DIR)
    (root / TRACKER_FILE).write_text(str(iteration))
    return target


def _sharded_model(shape: GPTShape, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The sharded state dict GPTModel itself would give on one rank: one shard per layer on a prepended axis."""
    mapping = import_megatron("megatron.core.dist_checkpointing.mapping")
    n = shape.num_layers
    sharded: dict[str, Any] = {}
    for key, tensor in tensors.items():
        if not key.startswith(LAYER_PREFIX):
            sharded[key] = mapping.ShardedTensor.from_rank_offsets(key, tensor, replica_id=0)
            continue
        for i in range(n):
            sharded[f"{key}#{i}"] = mapping.ShardedTensor.from_rank_offsets(
                key, tensor[i], (0, i, n), replica_id=0, prepend_axis_num=1
            )
    for key, global_shape in extra_state_keys(shape).items():
        for offset in itertools.product(*map(range, global_shape)):  # (layer,) or (layer, expert)
            name = f"{LAYER_PREFIX}{key}#{'.'.join(map(str, offset))}"
            sharded[name] = mapping.ShardedObject(LAYER_PREFIX + key, None, global_shape, offset, replica_id=0)
    return sharded


def _dist_save(state: dict[str, Any], target: Path) -> None:
    dist_checkpointing = import_megatron()
    extra = {}
    if "content_metadata" in inspect.signature(dist_checkpointing.save).parameters:
        extra["content_metadata"] = {"singleton_local_shards": False}  # as GPTModel's sharded_state_dict lays it out
    with megatron_runtime(), in_process_write_results():
        dist_checkpointing.save(state, str(target), **extra)


def _write_run_config(path: Path, shape: GPTShape, hf_config: dict[str, Any], dtype: torch.dtype) -> None:
    from omegaconf import OmegaConf

    OmegaConf.save(bridge_run_config(megatron_model_config(shape, hf_config, dtype)), path)


def _write_train_state(root: Path, target: Path, iteration: int) -> None:
    """Megatron-Bridge's train_state.pt (TrainState.state_dict()) in the iter folder and latest_train_state.pt
    beside it, as its save_checkpoint writes them; its loader finds the latest iteration through the latter."""
    state = {
        "step": torch.tensor(iteration, dtype=torch.int64),
        "consumed_train_samples": torch.tensor(0, dtype=torch.int64),
        "skipped_train_samples": torch.tensor(0, dtype=torch.int64),
        "consumed_valid_samples": torch.tensor(0, dtype=torch.int64),
        "floating_point_operations_so_far": torch.tensor(0, dtype=torch.float32),
        "do_train": torch.tensor(False),
        "do_valid": torch.tensor(False),
        "do_test": torch.tensor(False),
    }
    torch.save(state, target / TRAIN_STATE_FILE)
    torch.save(state, root / f"latest_{TRAIN_STATE_FILE}")


def bridge_run_config(model: dict[str, Any]) -> dict[str, Any]:
    """run_config.yaml as Megatron-Bridge writes it for an imported model (save_megatron_model's ConfigContainer):
    the sections its ConfigContainer.from_yaml requires, and the ones its checkpoint loading reads (checkpoint:
    save_optim, save_rng, fully_parallel_save; model: the parallel sizes). Every field not written keeps
    Bridge's default; `tokenizer:` is null as for a conversion without one (the tokenizer is in tokenizer/)."""
    return {
        "_target_": f"{BRIDGE_CONFIG}.ConfigContainer",
        "model": model,
        "train": None,
        "optimizer": {"_target_": f"{BRIDGE_CONFIG}.OptimizerConfig", "use_distributed_optimizer": False},
        "ddp": None,
        "scheduler": None,
        "dataset": None,
        "logger": {"_target_": f"{BRIDGE_CONFIG}.LoggerConfig"},
        "tokenizer": None,
        "checkpoint": {
            "_target_": f"{BRIDGE_CONFIG}.CheckpointConfig",
            "ckpt_format": "torch_dist",
            "async_save": False,
            "save_optim": False,
            "save_rng": False,
            "fully_parallel_save": True,
            "dist_ckpt_optim_fully_reshardable": True,
        },
        "dist": None,
    }


# ---------------------------------------------------------------------------------------------
# Reading


def read_hf_config(checkpoint_dir: Path) -> dict[str, Any]:
    """The Hugging Face config: hf_config/config.json as written here, else one derived from run_config.yaml
    (a checkpoint Megatron-LM or Megatron-Bridge wrote), its token ids taken from the tokenizer beside it."""
    config_file = checkpoint_dir / HF_CONFIG_DIR / "config.json"
    if config_file.is_file():
        return json.loads(config_file.read_text())
    run_config = checkpoint_dir / RUN_CONFIG_FILE
    if not run_config.is_file():
        raise ValueError(
            f"{checkpoint_dir} has neither {HF_CONFIG_DIR}/config.json nor {RUN_CONFIG_FILE}: "
            "nothing says which model the weights belong to"
        )
    hf_config = hf_config_from_megatron(read_model_section(run_config), str(run_config))
    return {**hf_config, **token_ids(checkpoint_dir / TOKENIZER_DIR)}


def read_model_section(run_config: Path) -> dict[str, Any]:
    """The `model:` section of a run_config.yaml, ours or Megatron-Bridge's (a ConfigContainer whose functions and
    dtypes are `{_target_: ..., _call_: false}` entries), as plain values: those entries become their dotted names."""
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(OmegaConf.load(run_config)).get("model") or {}
    return {key: target_name(value) for key, value in model.items()}


def token_ids(tokenizer_dir: Path) -> dict[str, int]:
    """pad, unk, bos and eos token ids of the tokenizer in `tokenizer_dir` (those it has), for a config rebuilt
    without hf_config/: a Megatron config does not hold them."""
    if not tokenizer_dir.is_dir():
        return {}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id", None) for name in ("pad", "unk", "bos", "eos")}
    return {key: value for key, value in ids.items() if value is not None}


def load_megatron_tensors(checkpoint_dir: Path, shape: GPTShape) -> dict[str, torch.Tensor]:
    """Every tensor the model reads, full size (layers stacked), checked against the checkpoint's metadata first.

    A torch_dist checkpoint is a torch.distributed.checkpoint (DCP) folder whose tensors are keyed by their
    Megatron sharded keys at their global shapes, so torch reads it alone: the same tensors, bit for bit, as
    megatron.core.dist_checkpointing.load, without its import (4-5 s) or a process group. DCP assembles a
    tensor saved in shards (tensor parallelism) whole."""
    from torch.distributed.checkpoint import FileSystemReader, TensorStorageMetadata

    stored = FileSystemReader(str(checkpoint_dir)).read_metadata().state_dict_metadata
    available = {key: item for key, item in stored.items() if isinstance(item, TensorStorageMetadata)}
    wanted = _checked_shapes(checkpoint_dir, shape, {key: tuple(item.size) for key, item in available.items()})
    loaded = {key: torch.empty(size, dtype=available[key].properties.dtype) for key, size in wanted.items()}
    load_in_this_process(loaded, checkpoint_dir)
    return {key: tensor[: shape.vocab_size] if key in PADDED_VOCAB_KEYS else tensor for key, tensor in loaded.items()}


def _checked_shapes(
    checkpoint_dir: Path, shape: GPTShape, available: dict[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """key -> shape stored in the checkpoint; LayoutError naming the first missing, mismatched or unknown tensor."""
    wanted = expected_shapes(shape)
    where = f"Megatron checkpoint {checkpoint_dir} ({shape.architecture}, from its config)"
    for key, expected in wanted.items():
        if key not in available:
            raise LayoutError(f"{where}: tensor {key} is missing")
        stored = available[key]
        padded_vocab = key in PADDED_VOCAB_KEYS and stored[1:] == expected[1:] and stored[0] >= expected[0]
        if stored != expected and not padded_vocab:
            raise LayoutError(f"{where}: tensor {key} has shape {stored}, the config expects {expected}")
    unknown = sorted(k for k in available if k not in wanted and _is_model_tensor(k))
    if unknown:
        raise LayoutError(
            f"{where}: tensor {unknown[0]} has no place in the supported GPT layout "
            f"({len(unknown)} such tensor{'s' if len(unknown) > 1 else ''}: {', '.join(unknown[:4])})"
        )
    return {key: available[key] for key in wanted}


def _is_model_tensor(key: str) -> bool:
    """Model weights, as opposed to optimizer, RNG and scheduler state that training checkpoints also hold."""
    return key.startswith(("embedding.", "decoder.", "output_layer."))


def load_megatron_checkpoint(
    ref: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float32
):
    """(model, tokenizer folder): the HF causal LM a checkpoint_megatron holds, on `device` in `dtype`
    ("auto": the dtype the checkpoint stores)."""
    from transformers import AutoModelForCausalLM

    checkpoint_dir = resolve_checkpoint_dir(ref)
    tokenizer_dir = checkpoint_dir / TOKENIZER_DIR
    if not tokenizer_dir.is_dir():
        raise ValueError(
            f"{checkpoint_dir} has no {TOKENIZER_DIR}/ folder (Megatron-LM does not write one): copy the "
            f"model's Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) into {tokenizer_dir}"
        )
    hf_config = read_hf_config(checkpoint_dir)
    shape = gpt_shape(hf_config)
    hf_state = to_hf(shape, load_megatron_tensors(checkpoint_dir, shape))
    if dtype == "auto":
        dtype = hf_state["model.embed_tokens.weight"].dtype
    config = _hf_config_object(checkpoint_dir, hf_config)
    with _skip_weight_init():  # every weight is overwritten next; random init would cost more than the load
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    hf_state = {name: tensor.to(dtype) for name, tensor in hf_state.items()}  # no copy when the dtype matches
    missing, unexpected = model.load_state_dict(hf_state, strict=False, assign=True)  # take the tensors, no second copy
    missing = [m for m in missing if not (shape.tied_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise LayoutError(
            f"{checkpoint_dir}: the {shape.architecture} model and the checkpoint disagree: "
            f"missing {missing or 'none'}, unexpected {unexpected or 'none'}"
        )
    if shape.tied_embeddings:
        model.tie_weights()
    _load_generation_config(model, checkpoint_dir / HF_CONFIG_DIR)
    return model.to(device).eval(), tokenizer_dir


def _skip_weight_init():
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # transformers 4
    return no_init_weights()


def _hf_config_object(checkpoint_dir: Path, hf_config: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    if (checkpoint_dir / HF_CONFIG_DIR / "config.json").is_file():
        return AutoConfig.from_pretrained(checkpoint_dir / HF_CONFIG_DIR)  # exactly the config that was written
    fields = {k: v for k, v in hf_config.items() if k != "model_type"}
    return AutoConfig.for_model(hf_config["model_type"], **fields)


def _load_generation_config(model: Any, folder: Path) -> None:
    if (folder / "generation_config.json").is_file():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(folder)
