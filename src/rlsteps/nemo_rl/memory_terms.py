"""The terms of a NeMo-RL job's memory per GPU, in bytes, and the changes that shrink each; pure. The rules and their
sources are rlsteps.nemo_rl.memory's docstring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlsteps.nemo_rl.model_shapes import Shape
from rlsteps.nemo_rl.placement import model_parallel, policy_gpus

GIB = 1024**3
PRECISION_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
LOGIT_COPIES = 3  # float32, tokens x vocabulary: the logits, their log-softmax, its gradient
VLLM_BLOCK = 16  # vLLM's CacheConfig.block_size on CUDA
LARGE_GPU = 70 * GIB  # vLLM's offline defaults above it (EngineArgs): 16384 batched tokens, 1024 sequences
VLLM_KEY = "policy.generation.vllm_cfg"
DTENSOR, MEGATRON = "policy.dtensor_cfg", "policy.megatron_cfg"


def gib(size: float, digits: int = 2) -> str:
    """Bytes in GiB as the note says them; a size under a hundredth of one in MiB."""
    if 0 < size < GIB / 100:
        return f"{size / 2**20:.1f} MiB"
    return f"{size / GIB:.{digits}f}"


@dataclass(frozen=True)
class Parameters:
    embedding: int
    head: int  # the output layer; 0 when tied to the embedding
    layers: int  # every decoder layer and the final norm
    largest_layer: int
    experts: int  # of `layers`, the routed experts' weights
    linear: int  # one layer's linear weights LoRA can adapt: sum of (in + out) over them

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.layers


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    rule: str  # how it is counted, in a few words
    changes: tuple[dict[str, Any], ...] = ()  # NeMo-RL's keys that shrink it, mildest first
    advice: str = ""  # the fix in words where no key does it


@dataclass(frozen=True)
class Phase:
    name: str
    terms: tuple[Term, ...]
    claimed: float | None = None  # what the phase holds when it is a claim (vLLM's share), not the terms' sum

    @property
    def bytes(self) -> float:
        return self.claimed if self.claimed is not None else sum(term.bytes for term in self.terms)

    @property
    def largest(self) -> Term:
        return max(self.terms, key=lambda term: term.bytes)

    def said(self) -> str:
        terms = " + ".join(f"{term.name} {gib(term.bytes)}" for term in self.terms)
        if self.claimed is not None:
            return f"{self.name} {gib(self.bytes, 1)} ({terms})"
        return f"{self.name} {gib(self.bytes, 1)} = {terms}"


def _mlp(hidden: int, width: int, bias: bool) -> int:
    """A gated MLP (gate, up, down), as transformers' Llama, Qwen and Mixtral experts."""
    return 3 * hidden * width + (2 * width + hidden if bias else 0) if width else 0


def count_parameters(shape: Shape) -> Parameters:
    """The parameters transformers builds for a Llama-like decoder of `shape` (torch's count: a tied matrix once)."""
    h, hd = shape.hidden, shape.head_dim
    q, kv = shape.heads * hd, shape.kv_heads * hd
    attention = 2 * h * q + 2 * h * kv
    attention += (q + 2 * kv if shape.qkv_bias else 0) + (h if shape.o_bias else 0) + (2 * hd if shape.qk_norm else 0)
    routed = shape.experts * _mlp(h, shape.expert_intermediate, shape.mlp_bias)
    moe = routed + h * shape.experts + _mlp(h, shape.shared_intermediate, shape.mlp_bias) + h * shape.shared_gate
    sparse = shape.layers - shape.dense_layers if shape.experts else 0
    dense_layer = attention + 2 * h + _mlp(h, shape.intermediate, shape.mlp_bias)
    moe_layer = attention + 2 * h + moe
    dense = shape.layers - sparse
    embedding = shape.vocab * h
    return Parameters(
        embedding=embedding,
        head=0 if shape.tied else embedding,
        layers=dense * dense_layer + sparse * moe_layer + h,
        largest_layer=max(dense_layer if dense else 0, moe_layer if sparse else 0),
        experts=sparse * routed,
        linear=2 * (h + q) + 2 * (h + kv) + 3 * (h + (shape.intermediate or shape.expert_intermediate)),
    )


def policy_phases(
    master: dict[str, Any], shape: Shape, params: Parameters, gpu: float | None
) -> tuple[tuple[Phase, ...], str]:
    """The phases on one policy GPU (generation's on its own GPUs where it is not colocated) and vLLM's KV cache."""
    policy = master["policy"]
    weights, gradients, optimizer = _training_state(master, shape, params)
    activations, logits = _activations(master, shape, params)
    training = Phase("training", (weights, gradients, optimizer, activations, logits))
    offloaded = bool(policy.get("offload_optimizer_for_logprob"))
    logprob_optimizer = Term(
        "optimizer state", 0.0 if offloaded else optimizer.bytes, optimizer.rule,
        ({"policy.offload_optimizer_for_logprob": True},),
    )  # fmt: skip
    logprobs = Phase("log-probs", (weights, logprob_optimizer, _logprob_logits(master, shape)))
    vllm = policy["generation"]["vllm_cfg"]
    generation, kv = vllm_fit(
        shape,
        tp=int(vllm.get("tensor_parallel_size") or 1),
        pp=int(vllm.get("pipeline_parallel_size") or 1),
        utilization=float(vllm["gpu_memory_utilization"]),
        max_len=vllm.get("max_model_len") or policy["max_total_sequence_length"],
        dtype_bytes=PRECISION_BYTES.get(str(vllm.get("precision") or policy["precision"]), 2),
        kwargs={**(policy["generation"].get("vllm_kwargs") or {}), "kv_cache_dtype": vllm.get("kv_cache_dtype")},
        gpu=gpu,
        name="generation",
        fix=_tp_changes(f"{VLLM_KEY}.tensor_parallel_size", int(vllm.get("tensor_parallel_size") or 1), shape, 8),
    )
    if not policy["generation"]["colocated"]["enabled"]:
        own = Phase("generation on its own GPUs", generation.terms, generation.claimed)
        return (training, logprobs, own), kv
    refit = Phase("refit", (Term("policy weights", weights.bytes, weights.rule, weights.changes, weights.advice),
                            generation.terms[0]))  # fmt: skip
    return (training, logprobs, refit, generation), kv


def _training_state(master: dict[str, Any], shape: Shape, params: Parameters) -> tuple[Term, Term, Term]:
    policy = master["policy"]
    if policy["megatron_cfg"].get("enabled"):
        return _megatron_state(master, shape, params)
    dtensor = policy["dtensor_cfg"]
    gpus = max(policy_gpus(master), 1)
    shards = max(gpus // int(dtensor.get("dp_replicate_size") or 1), 1)
    tp, dtype = int(dtensor["tensor_parallel_size"]), PRECISION_BYTES.get(policy["precision"], 2)
    lora = (dtensor.get("lora_cfg") or {}).get("enabled")
    trainable = shape.layers * int(dtensor["lora_cfg"]["dim"]) * params.linear if lora else params.total
    offload = bool(dtensor.get("cpu_offload"))
    stored = 0 if offload else 1
    where = f"float32, FSDP2 shards over {shards} GPU(s)"
    gathered = 2 * max(params.largest_layer, params.embedding) * dtype / tp
    changes = ({f"{DTENSOR}.cpu_offload": True},) if gpus > 1 and not offload else ()
    advice = "give the profile more GPUs (FSDP2 shards weights, gradients and optimizer state over all of them)"
    return (
        Term("weights", stored * params.total * 4 / shards + gathered, f"{where}, 2 layers gathered", changes, advice),
        Term("gradients", stored * trainable * 4 / shards, where, changes, advice),
        Term("optimizer state", stored * trainable * 8 / shards, f"AdamW's 2 states, {where}", changes, advice),
    )


def _megatron_state(master: dict[str, Any], shape: Shape, params: Parameters) -> tuple[Term, Term, Term]:
    policy = master["policy"]
    megatron = policy["megatron_cfg"]
    tp, pp = int(megatron["tensor_model_parallel_size"]), int(megatron["pipeline_model_parallel_size"])
    ep = int(megatron.get("expert_model_parallel_size") or 1)
    etp = int(megatron.get("expert_tensor_parallel_size") or tp)
    dp = max(policy_gpus(master) // (tp * pp), 1)  # the distributed optimizer's shards (data x context parallel)
    ends = params.embedding + params.head if pp == 1 else max(params.embedding, params.head)
    model = ((params.layers - params.experts) / pp + ends) / tp + params.experts / pp / (ep * etp)
    dtype = PRECISION_BYTES.get(policy["precision"], 2)
    fp32_grads = bool((megatron.get("distributed_data_parallel_config") or {}).get("grad_reduce_in_fp32"))
    grad = 4 if fp32_grads or dtype == 4 else 2
    optimizer = megatron.get("optimizer") or {}
    state = (0 if dtype == 4 else 4) + 8 + (4 if grad == 2 else 0)  # main params, Adam's 2, main grads
    shards = dp if optimizer.get("use_distributed_optimizer") else 1
    kept = 1 - float(optimizer.get("optimizer_offload_fraction") or 0) if optimizer.get("optimizer_cpu_offload") else 1
    wider = _tp_changes(f"{MEGATRON}.tensor_model_parallel_size", tp, shape, policy_gpus(master) // pp)
    offload = (
        {f"{MEGATRON}.optimizer.optimizer_cpu_offload": True, f"{MEGATRON}.optimizer.optimizer_offload_fraction": 1.0},
    )
    where = f"tp {tp} x pp {pp}" + (f", experts ep {ep}" if shape.experts else "")
    return (
        Term("weights", model * dtype, f"{policy['precision']}, {where}", wider),
        Term("gradients", model * grad, f"{'float32' if grad == 4 else policy['precision']} buffer, {where}", wider),
        Term("optimizer state", model * state * kept / shards, f"{state} bytes a parameter over {shards}", offload),
    )  # fmt: skip


def _tp_changes(key: str, tp: int, shape: Shape, most: int) -> tuple[dict[str, Any], ...]:
    sizes = [tp * 2**n for n in range(1, 4) if tp * 2**n <= max(most, 1)]
    fits = [s for s in sizes if shape.heads % s == 0 and (shape.kv_heads % s == 0 or s % shape.kv_heads == 0)]
    return tuple({key: size} for size in fits)


def _parallel(policy: dict[str, Any]) -> tuple[int, int, bool, bool, str]:
    """tensor, context parallel, sequence parallel, activation checkpointing and the backend's key."""
    if policy["megatron_cfg"].get("enabled"):
        m = policy["megatron_cfg"]
        return (int(m["tensor_model_parallel_size"]), int(m["context_parallel_size"]), bool(m.get("sequence_parallel")),
                bool(m.get("activation_checkpointing")), MEGATRON)  # fmt: skip
    d = policy["dtensor_cfg"]
    return (int(d["tensor_parallel_size"]), int(d["context_parallel_size"]), bool(d.get("sequence_parallel")),
            bool(d.get("activation_checkpointing")), DTENSOR)  # fmt: skip


def _micro_tokens(policy: dict[str, Any], kind: str) -> tuple[int, dict[str, Any]]:
    """Tokens in one micro-batch (`kind` train or logprob) and the keys that set it, with their values now."""
    size_key = "train_micro_batch_size" if kind == "train" else "logprob_batch_size"
    micro = int(policy.get(size_key) or policy["train_micro_batch_size"])
    for section in ("sequence_packing", "dynamic_batching"):
        if policy[section].get("enabled"):
            tokens = int(policy[section].get(f"{kind}_mb_tokens") or micro * policy["max_total_sequence_length"])
            return tokens, {f"policy.{size_key}": micro, f"policy.{section}.{kind}_mb_tokens": tokens}
    return micro * int(policy["max_total_sequence_length"]), {f"policy.{size_key}": micro}


def _smaller_micro(master: dict[str, Any], kind: str) -> tuple[dict[str, Any], ...]:
    """Micro-batches from one smaller down to 1 that split each rank's rows (rlsteps's config and NeMo-RL's
    worker ask it), each with its token budget (the template's: length x size)."""
    policy = master["policy"]
    _, keys = _micro_tokens(policy, kind)
    size_key = next(iter(keys))
    length = int(policy["max_total_sequence_length"])
    rows = int(policy["train_global_batch_size"])
    share = rows // max(policy_gpus(master) // model_parallel(master), 1)
    sizes = [size for size in range(keys[size_key] - 1, 0, -1) if rows % size == 0 and share % size == 0]
    return tuple({key: size if key == size_key else size * length for key in keys} for size in sizes)


def _activations(master: dict[str, Any], shape: Shape, params: Parameters) -> tuple[Term, Term]:
    policy = master["policy"]
    tp, cp, sp, checkpointing, backend = _parallel(policy)
    tokens, _ = _micro_tokens(policy, "train")
    tokens /= cp
    dtype = PRECISION_BYTES.get(policy["precision"], 2)
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    width = shape.experts_per_token * shape.expert_intermediate + shape.shared_intermediate
    width = width if shape.experts else shape.intermediate
    norms = shape.hidden / (tp if sp else 1)
    if backend == MEGATRON:  # Transformer Engine's fused norm-linear, rotary and attention keep fewer copies
        layer = dtype * tokens * (4 * norms + (2 * (q + kv) + 3 * width) / tp)
    else:  # transformers' modules, as torch's autograd saves them (a test counts them)
        layer = dtype * tokens * (8 * norms + (3 * (q + kv) + 4 * width) / tp)
    if checkpointing:
        held, rule = shape.layers * dtype * tokens * norms + layer, "checkpointed: layer inputs + 1 layer"
    else:
        held, rule = shape.layers * layer, f"{shape.layers} layer(s)"
    smaller = _smaller_micro(master, "train")
    wider = _tp_changes(f"{backend}.{'tensor_model_parallel_size' if backend == MEGATRON else 'tensor_parallel_size'}",
                        tp, shape, policy_gpus(master))  # fmt: skip
    checkpoint = () if checkpointing else ({f"{backend}.activation_checkpointing": True},)
    logits = tokens * shape.vocab / tp * 4 * LOGIT_COPIES
    copies = f"{LOGIT_COPIES} float32 copies of {int(tokens)} tokens x {shape.vocab}"
    return (
        Term("activations", held, f"{int(tokens)} tokens, {rule}", smaller + checkpoint + wider),
        Term("logits", logits, copies, smaller + wider),
    )


def _logprob_logits(master: dict[str, Any], shape: Shape) -> Term:
    policy = master["policy"]
    tp, cp, *_ = _parallel(policy)
    tokens, _ = _micro_tokens(policy, "logprob")
    rule = f"2 float32 copies of {int(tokens / cp)} tokens x {shape.vocab}"
    return Term("logits", tokens / cp * shape.vocab / tp * 4 * 2, rule, _smaller_micro(master, "logprob"))


def kv_cache_per_token(shape: Shape, tp: int, pp: int, kv_bytes: int) -> int:
    """vLLM's FullAttentionSpec: keys and values of each layer's key-value heads on this rank (at least one: vLLM
    replicates them past tp), head_dim wide, a page of block_size tokens over block_size."""
    return shape.layers // pp * 2 * max(1, shape.kv_heads // tp) * shape.head_dim * kv_bytes


def one_request(per_token: int, max_len: int, block: int = VLLM_BLOCK) -> int:
    """vLLM's max_memory_usage_bytes: the blocks one request of max_len takes, whole blocks."""
    return -(-max_len // block) * block * per_token


def vllm_fit(
    shape: Shape,
    *,
    tp: int,
    pp: int,
    utilization: float,
    max_len: int | None,
    dtype_bytes: int,
    kwargs: dict[str, Any],
    gpu: float | None,
    name: str,
    fix: tuple[dict[str, Any], ...],
) -> tuple[Phase, str]:
    """vLLM's share of a GPU: its weights, its profiled peak (about) and the KV cache the rest holds; what that says."""
    params = count_parameters(shape)
    weights = Term("vLLM weights", params.total * dtype_bytes / (tp * pp), f"tp {tp} x pp {pp}", fix)
    large = gpu is not None and gpu >= LARGE_GPU
    batched = int(kwargs.get("max_num_batched_tokens") or (16384 if large else 8192))
    seqs = min(int(kwargs.get("max_num_seqs") or (1024 if large else 256)), batched)
    width = shape.experts_per_token * shape.expert_intermediate + shape.shared_intermediate or shape.intermediate
    peak = batched * (2 * shape.hidden + 2 * width / tp) * dtype_bytes + seqs * shape.vocab / tp * 4 * 2
    profiled = Term("vLLM activations", peak, f"{batched} batched tokens, {seqs} sequences' logits (about)", fix)
    kv_bytes = 1 if str(kwargs.get("kv_cache_dtype") or "auto").startswith("fp8") else dtype_bytes
    per_token = kv_cache_per_token(shape, tp, pp, kv_bytes)
    block = int(kwargs.get("block_size") or VLLM_BLOCK)
    if gpu is None:
        said = f"{name}: vLLM's share is gpu_memory_utilization {utilization:g} of the GPU, its KV cache the rest "
        said += f"({per_token / 1024:.0f} KiB a token)"
        return Phase(name, (weights, profiled)), said
    free = utilization * gpu - weights.bytes - profiled.bytes
    cache = Term("KV cache", max(free, 0.0), f"{per_token / 1024:.0f} KiB a token")
    phase = Phase(name, (weights, profiled, cache), claimed=utilization * gpu)
    if not max_len:
        return phase, f"{name}'s KV cache {max(free, 0) / GIB:.1f} GiB (its max_model_len is the model's own)"
    request = one_request(per_token, int(max_len), block)
    if free - block * per_token < request:  # vLLM plans without the null block
        return phase, (
            f"vLLM refuses to start ({name}): gpu_memory_utilization {utilization:g} leaves about "
            f"{max(free, 0) / GIB:.2f} GiB for the KV cache past its weights {weights.bytes / GIB:.2f} and profiled "
            f"peak {profiled.bytes / GIB:.2f}, and one request of max_model_len {max_len} needs "
            f"{request / GIB:.2f} GiB ('To serve at least one request with the model's max seq len', kv_cache_utils)"
        )
    return phase, f"{name}'s KV cache {free / GIB:.1f} GiB holds {int(free // request)} request(s) of {max_len} tokens"
