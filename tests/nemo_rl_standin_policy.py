"""The policy workers' forward and backward, stood in for NeMo-RL's DTensor (v1, v2) and Megatron workers on a CPU
(tests/nemo_rl_run.py).

NeMo-RL's Policy (lm_policy) runs as it is and shards each call's data over its workers; the stand-in worker takes
its shard and runs it as the real worker's train does: the same global batches and micro-batch iterators (plain,
dynamic batching, sequence packing with NeMo-RL's pack_sequences and SequencePackingLossWrapper), NeMo-RL's own loss
function through its prepare_loss_input, on the logits of a small real model (an embedding and a projection to the
policy's vocabulary: the right shapes, real gradients), then an optimizer step and the learning-rate schedule built
from policy.optimizer and policy.scheduler as the DTensor worker builds them. The Megatron worker first runs NeMo-RL's
Megatron config checks that need no GPU, the DTensor v2 worker NeMo-RL's validate_and_prepare_config. Collectives
over the data-parallel ranks do not exist in one process: the global normalisers are this rank's counts times the
data-parallel size.
"""

from __future__ import annotations

import contextlib
import types
import typing
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

import standin_ray


class TinyLM(torch.nn.Module):
    """Logits of the right shape with real gradients: an embedding and a projection to the vocabulary."""

    def __init__(self, vocab: int, width: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids))


def policy_worker_class():
    from nemo_rl.algorithms.loss import SequencePackingLossWrapper, prepare_loss_input
    from nemo_rl.algorithms.loss.interfaces import LossType
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl.models.huggingface.common import get_flash_attention_kwargs, pack_sequences
    from nemo_rl.models.policy.workers.base_policy_worker import AbstractPolicyWorker

    class StandInPolicyWorker(AbstractPolicyWorker):
        backend = "dtensor"

        def __init__(self, config, tokenizer=None, processor=None, weights_path=None, optimizer_path=None,
                     init_optimizer=True, init_reference_model=True, *, worker_sharding_annotations,
                     pre_init_communication_queue=None, **kwargs):  # fmt: skip
            from nemo_rl.algorithms.utils import get_tokenizer
            from transformers import AutoConfig

            self.cfg = config
            env = standin_ray.current_env()
            self.rank = int(env.get("RANK", 0))
            self.dp_size = worker_sharding_annotations.get_axis_size("data_parallel")
            self.tokenizer = tokenizer if tokenizer is not None else get_tokenizer(config["tokenizer"])
            self.enable_seq_packing = config["sequence_packing"]["enabled"]
            if self.backend == "megatron":
                self.dtype = megatron_checks(config)
            else:
                lora_checks(config)
            if self.backend == "dtensor_v2":
                automodel_checks(config)
            vocab = AutoConfig.from_pretrained(config["model_name"]).vocab_size
            generator_state = torch.random.get_rng_state()
            torch.manual_seed(1234)
            self.model = TinyLM(vocab)
            torch.random.set_rng_state(generator_state)
            self.reference = TinyLM(vocab) if init_reference_model else None
            if self.reference is not None:
                self.reference.load_state_dict(self.model.state_dict())
            self.optimizer, self.scheduler = build_optimizer(config, self.model) if init_optimizer else (None, None)
            self._reference_active = False

        # -- what the GPU would do ------------------------------------------------------------------------------

        def _microbatches(self, data, size: int):
            if self.cfg["dynamic_batching"]["enabled"]:
                return data.make_microbatch_iterator_with_dynamic_shapes()
            if self.enable_seq_packing:
                return data.make_microbatch_iterator_for_packable_sequences()
            return data.make_microbatch_iterator(size)

        def _logits(self, mb) -> tuple[torch.Tensor, Any]:
            model = self.reference if self._reference_active else self.model
            input_ids = mb["input_ids"]
            if not self.enable_seq_packing:
                return model(input_ids), None
            packed, _, _ = pack_sequences(
                input_ids=input_ids,
                input_lengths=mb["input_lengths"],
                packed_sequence_size=[len(mb["input_lengths"])],
                padding_value=self.tokenizer.eos_token_id,
                return_attention_mask=False,
                min_seq_len=self.cfg["sequence_packing"]["train_mb_tokens"],
            )
            return model(packed), get_flash_attention_kwargs(input_lengths=mb["input_lengths"])

        @staticmethod
        def _check_sequence_dims(data) -> None:
            size = data["input_ids"].shape[1]
            for key, value in data.items():
                if torch.is_tensor(value) and value.dim() > 1:
                    assert value.shape[1] == size, f"Dim 1 must be the sequence dim, got {key} {tuple(value.shape)}"

        def get_logprobs(self, *, data, micro_batch_size=None):
            self._check_sequence_dims(data)
            size = micro_batch_size or self.cfg["logprob_batch_size"]
            rows = []
            with torch.no_grad():
                for mb in self._microbatches(data, size):
                    model = self.reference if self._reference_active else self.model
                    logprobs = torch.log_softmax(model(mb["input_ids"]).float(), dim=-1)
                    taken = torch.gather(logprobs[:, :-1], 2, mb["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
                    rows.append(torch.nn.functional.pad(taken, (1, 0)))
            width = max(r.shape[1] for r in rows)
            out = torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1])) for r in rows])
            return BatchedDataDict(logprobs=out)

        @contextlib.contextmanager
        def use_reference_model(self):
            assert self.reference is not None, "the reference model was not initialised (init_reference_model)"
            self._reference_active = True
            try:
                yield
            finally:
                self._reference_active = False

        def train(self, data, loss_fn, eval_mode=False, gbs=None, mbs=None, check_dim_skip_keys=None):
            gbs = gbs or self.cfg["train_global_batch_size"]
            mbs = mbs or self.cfg["train_micro_batch_size"]
            local_gbs = gbs // self.dp_size
            # the real worker all-reduces the shards' sizes over DP: equal shards, or (sequence packing's uneven
            # ones) the global batches the sharding made
            packed = data.elem_counts_per_gb
            num_global_batches = len(packed) if packed is not None else (data.size * self.dp_size) // gbs
            self._check_sequence_dims(data)
            losses, all_mb_metrics, grad_norm = [], [], None
            for gb_idx in range(num_global_batches):
                batch = data.get_batch(batch_idx=gb_idx, batch_size=local_gbs)
                assert "sample_mask" in batch, "sample_mask must be present in the data!"
                valid_seqs = torch.sum(batch["sample_mask"])
                if "token_mask" in batch:
                    valid_toks = torch.sum(batch["token_mask"][:, 1:] * batch["sample_mask"].unsqueeze(-1))
                else:
                    valid_toks = valid_seqs * batch["input_ids"].shape[1]
                global_seqs, global_toks = valid_seqs * self.dp_size, valid_toks * self.dp_size
                if getattr(loss_fn, "loss_type", None) == LossType.TOKEN_LEVEL:
                    assert "token_mask" in batch, "token_mask must be present in the data when using token-level loss"
                if self.optimizer is not None:
                    self.optimizer.zero_grad()
                mb_losses = []
                for mb in self._microbatches(batch, mbs):
                    logits, flash = self._logits(mb)
                    if flash is not None:
                        wrapped = SequencePackingLossWrapper(
                            loss_fn=loss_fn, prepare_fn=prepare_loss_input,
                            cu_seqlens_q=flash.cu_seqlens_q, cu_seqlens_q_padded=flash.cu_seqlens_q,
                        )  # fmt: skip
                        loss, metrics = wrapped(logits, mb, global_seqs, global_toks)
                    else:
                        loss_input, mb = prepare_loss_input(logits, mb, loss_fn)
                        loss, metrics = loss_fn(data=mb, global_valid_seqs=global_seqs,
                                                global_valid_toks=global_toks, **loss_input)  # fmt: skip
                    assert torch.isfinite(loss), f"the loss is {loss.item()} on a micro-batch"
                    for key in [k for k in metrics if "_min" not in k and "_max" not in k]:
                        metrics[key] /= num_global_batches
                    metrics["lr"] = self.optimizer.param_groups[0]["lr"] if self.optimizer else 0.0
                    metrics["global_valid_seqs"], metrics["global_valid_toks"] = global_seqs.item(), global_toks.item()
                    if not eval_mode:
                        loss.backward()
                    if metrics["num_valid_samples"] > 0:
                        mb_losses.append(loss.item())
                        all_mb_metrics.append(metrics)
                if not eval_mode:
                    grad_norm = torch.tensor([float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1e9))])
                    self.optimizer.step()
                losses.append(torch.tensor(mb_losses).sum().item())
            if not eval_mode and self.scheduler is not None:
                self.scheduler.step()
            metrics = defaultdict(list)
            for m in all_mb_metrics:
                for key, value in m.items():
                    metrics[key].append(value)
            return {
                "global_loss": torch.tensor(losses) * self.dp_size,
                "grad_norm": grad_norm,
                "rank": self.rank,
                "gpu_name": "NVIDIA H100 80GB HBM3",
                "model_dtype": torch.bfloat16,
                "all_mb_metrics": dict(metrics),
            }

        def score(self, data):
            with torch.no_grad():
                logits = self.model(data["input_ids"]).float()
            last = (data["input_lengths"] - 1).clamp(min=0)
            scores = logits[torch.arange(len(last)), last].mean(-1)
            return BatchedDataDict(scores=scores)

        # -- the rest of the worker's interface, where it only moves memory between devices -----------------------

        def prepare_refit_info(self):
            return {name: (tuple(p.shape), p.dtype) for name, p in self.model.state_dict().items()}

        def stream_weights_via_ipc_zmq(self, buffer_size_bytes: int = 0, kv_scales=None):
            assert buffer_size_bytes > 0, f"refit buffer of {buffer_size_bytes} bytes"
            return None

        def broadcast_weights_for_collective(self, kv_scales=None):
            return None

        def get_free_memory_bytes(self) -> int:
            return 60 * 1024**3

        def report_device_id(self) -> str:
            return f"GPU-standin-{self.rank}"

        def report_node_ip_and_gpu_id(self):
            return ("127.0.0.1", (standin_ray.get_gpu_ids() or [0])[0])

        def get_gpu_info(self) -> dict[str, Any]:
            return {"rank": self.rank, "gpu_name": "stand-in"}

        def reset_peak_memory_stats(self) -> None:
            return None

        def init_collective(self, ip, port, world_size, *, train_world_size):
            return None

        def save_checkpoint(self, weights_path, optimizer_path=None, tokenizer_path=None, **kwargs):
            Path(weights_path).mkdir(parents=True, exist_ok=True)
            torch.save(self.model.state_dict(), Path(weights_path) / f"rank{self.rank}.pt")
            if optimizer_path and self.optimizer is not None:
                Path(optimizer_path).mkdir(parents=True, exist_ok=True)
                torch.save(self.optimizer.state_dict(), Path(optimizer_path) / f"rank{self.rank}.pt")
            if tokenizer_path:
                self.tokenizer.save_pretrained(tokenizer_path)

        def _noop(self, *args, **kwargs):
            return None

        prepare_for_lp_inference = prepare_for_training = finish_training = _noop
        offload_before_refit = offload_after_refit = move_optimizer_to_device = _noop
        start_gpu_profiling = stop_gpu_profiling = finish_inference = _noop

    return StandInPolicyWorker


def build_optimizer(config: dict, model: torch.nn.Module):
    """The optimizer and the learning-rate schedule as the DTensor worker builds them: policy.optimizer's class and
    kwargs, then policy.scheduler (one scheduler, or a list chained by SequentialLR at its milestones entry; a list
    without that entry stops the real worker too), else a constant schedule. Megatron's come from megatron-core on a
    GPU: a plain AdamW at megatron_cfg.optimizer.lr stands in."""
    from hydra.utils import get_class as class_at

    if config["megatron_cfg"].get("enabled"):
        optimizer = torch.optim.AdamW(model.parameters(), lr=config["megatron_cfg"]["optimizer"]["lr"])
        return optimizer, None
    optimizer = class_at(config["optimizer"]["name"])(model.parameters(), **config["optimizer"]["kwargs"])
    scheduler = config.get("scheduler")
    if scheduler is None:
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda _: 1)
    if isinstance(scheduler, dict):
        return optimizer, class_at(scheduler["name"])(optimizer, **scheduler["kwargs"])
    chained = [class_at(entry["name"])(optimizer, **entry["kwargs"]) for entry in scheduler if "name" in entry]
    (milestones,) = [entry["milestones"] for entry in scheduler if "name" not in entry]
    return optimizer, torch.optim.lr_scheduler.SequentialLR(optimizer, chained, milestones)


def lora_checks(config: dict) -> None:
    """policy.dtensor_cfg.lora_cfg against NeMo-RL's own declaration of it (its LoRAConfig): every key it requires,
    none it does not declare, each value of the declared type. Automodel, which reads it on the GPU node, is not
    installed here; NeMo-RL's Policy has already asserted that LoRA runs on the DTensor v2 worker."""
    from nemo_rl.models.policy import LoRAConfig

    lora_cfg = config["dtensor_cfg"].get("lora_cfg") or {}
    if not lora_cfg.get("enabled"):
        return
    declared = typing.get_type_hints(LoRAConfig)
    missing, unknown = sorted(LoRAConfig.__required_keys__ - set(lora_cfg)), sorted(set(lora_cfg) - set(declared))
    if missing or unknown:
        raise KeyError(f"lora_cfg: missing {missing}, not in NeMo-RL's LoRAConfig {unknown}")
    wrong = {key: value for key, value in lora_cfg.items() if not _of_type(value, declared[key])}
    if wrong:
        raise TypeError(f"lora_cfg values not of NeMo-RL's LoRAConfig types: {wrong}")


def automodel_checks(config: dict) -> None:
    """The DTensor v2 worker's own config checks (NeMo-RL's validate_and_prepare_config: precision, sequence packing
    against context parallelism, the attention kernel, reward models), on the policy's config.json."""
    from nemo_rl.models.automodel.setup import validate_and_prepare_config

    validate_and_prepare_config(config, processor=None, rank=0)


def _of_type(value: Any, declared: Any) -> bool:
    """Whether a config value is of a TypedDict field's type (the kinds LoRAConfig uses)."""
    origin, args = typing.get_origin(declared), typing.get_args(declared)
    if origin is typing.Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(_of_type(item, args[0]) for item in value)
    if declared is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if declared is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, declared)


def megatron_checks(config: dict) -> torch.dtype:
    """NeMo-RL's Megatron config checks that need no GPU and no Megatron-Bridge model provider (built from the HF
    model by Megatron-Bridge on the GPU node: the MoE, MTP and performance settings read its fields), in the order
    validate_and_set_config and setup_model_config run them, over a model config namespace."""
    from nemo_rl.models.megatron import setup

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[config["precision"]]
    if "reward_model_cfg" in config and config["reward_model_cfg"]["enabled"]:
        raise NotImplementedError("Reward models are not yet supported with the Megatron backend")
    model_cfg = types.SimpleNamespace()
    setup._apply_parallelism_config(model_cfg, config)
    setup._apply_precision_config(model_cfg, config, dtype)
    setup._validate_optimizer_config(config)
    setup._validate_chunking_config(config)
    setup._validate_training_config(config, model_cfg)
    optimizer = types.SimpleNamespace(**{"use_precision_aware_optimizer": False, **config["megatron_cfg"]["optimizer"]})
    setup._validate_dtype_config(dtype, model_cfg, optimizer)
    return dtype
