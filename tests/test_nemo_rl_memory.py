"""The memory a NeMo-RL job holds on each GPU (rlsteps.nemo_rl.memory): parameters counted from config.json as torch
counts them, the bytes a parameter against the published rules (mixed-precision Adam's 16, Megatron-LM's distributed
optimizer table), activations against what torch's autograd saves, vLLM's KV cache against vLLM's own classes,
NeMo-RL's published placements against 80 GiB GPUs, and the dry run's note and refusal."""

from __future__ import annotations

import copy
import json
import struct
import subprocess
from pathlib import Path

import pytest
import yaml

from rlsteps.catalog import load_catalog
from rlsteps.contract.nemo_rl_job import MASTER_CONFIG_FILE
from rlsteps.errors import UsageError
from rlsteps.nemo_rl.memory import GIB, count_parameters, estimate
from rlsteps.nemo_rl.memory_terms import policy_phases
from rlsteps.nemo_rl.model_shapes import _shape_of, read_shape
from rlsteps.plan.runner import RunRequest, compile_request

LLAMA = {"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "vocab_size": 128256, "tie_word_embeddings": False}  # fmt: skip
# config.json of each checkpoint on the Hugging Face Hub (the keys a count reads) and its published parameter count:
# the total_size of its model.safetensors.index.json over 2 bytes (bf16), e.g. 16,060,522,496 for Llama-3.1-8B
PUBLISHED = {
    "meta-llama/Llama-3.1-8B": ({**LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32},
                                8_030_261_248),
    "meta-llama/Llama-3.1-70B": ({**LLAMA, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                                  "num_attention_heads": 64}, 70_553_706_496),
    "meta-llama/Llama-3.2-1B": ({**LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                                 "head_dim": 64, "tie_word_embeddings": True}, 1_235_814_400),
    "Qwen/Qwen2.5-7B": ({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
                         "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                         "vocab_size": 152064, "tie_word_embeddings": False}, 7_615_616_512),
    "Qwen/Qwen2.5-1.5B": ({"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
                           "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                           "vocab_size": 151936, "tie_word_embeddings": True}, 1_543_714_304),
    "Qwen/Qwen2.5-32B": ({"model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 27648,
                          "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
                          "vocab_size": 152064, "tie_word_embeddings": False}, 32_763_876_352),
    "mistralai/Mixtral-8x7B-v0.1": ({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                     "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
                                     "tie_word_embeddings": False}, 46_702_792_704),
}  # fmt: skip
LLAMA_8B = "meta-llama/Llama-3.1-8B"
JUDGE_KWARGS = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.vllm_serve_kwargs"
H100 = 79.6  # GiB: an H100 80GB's 81,559 MiB, as torch.cuda reports it (NeMo-RL's recipes run on 80 GiB GPUs)
PROFILES = {
    "h100": {"executor": "slurm", "nodes": 2, "gpus_per_node": 8, "gpu_memory_gib": H100,
             "container_image": "/images/nemo-rl.sqsh", "job_dir": "/lustre/jobs", "cluster_paths": ["/lustre"],
             "config": {"run": {"dtype": "bfloat16"}}},
    "unstated": {"extends": "h100", "gpu_memory_gib": None},
}  # fmt: skip


def shape_of(name: str):
    return _shape_of(PUBLISHED[name][0], name)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameters_counted_from_config_json_are_the_published_counts(name):
    assert count_parameters(shape_of(name)).total == PUBLISHED[name][1]


def test_a_small_llama_counted_by_hand_and_by_torch(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "num_hidden_layers": 2, "vocab_size": 100, "tie_word_embeddings": False}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape, _ = read_shape(str(tmp_path))
    # embedding 100 x 64 = 6,400 and the output layer as much; per layer: q 64 x 64 = 4,096, k and v 64 x 32 = 2,048
    # each, o 4,096 (12,288), the MLP 3 x 64 x 176 = 33,792, two norms 128: 46,208, twice 92,416; the final norm 64
    assert count_parameters(shape).total == 6_400 * 2 + 92_416 + 64 == 105_280
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    assert sum(p.numel() for p in model.parameters()) == 105_280


def test_the_tiny_world_policy_counted_as_torch_counts_it(tiny_world):
    from transformers import AutoModelForCausalLM

    shape, _ = read_shape(str(tiny_world.policy))
    model = AutoModelForCausalLM.from_pretrained(tiny_world.policy)
    assert shape.tied and count_parameters(shape).total == sum(p.numel() for p in model.parameters())


def test_smollm2_counted_as_its_weights_file_holds_it():
    """SmolLM2-135M-Instruct as the vLLM tests build it (tests/vllm_judge.py smollm2_hf): the tensors its
    safetensors header lists, the tied output layer stored once."""
    from vllm_judge import smollm2_hf  # built once (CI builds it before the tests); without vLLM's environment a skip

    folder = smollm2_hf()
    with open(folder / "model.safetensors", "rb") as weights:
        (size,) = struct.unpack("<Q", weights.read(8))
        header = json.loads(weights.read(size))
    stored = sum(_product(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
    shape, _ = read_shape(str(folder))
    assert count_parameters(shape).total == stored == 134_515_008  # Hugging Face: "135M"


def _product(dims: list[int]) -> int:
    total = 1
    for dim in dims:
        total *= dim
    return total


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nemo_rl_memory")
    (folder / "llama8b").mkdir()
    (folder / "llama8b" / "config.json").write_text(json.dumps(PUBLISHED["meta-llama/Llama-3.1-8B"][0]))
    (folder / "rlsteps.yaml").write_text(yaml.safe_dump({"profiles": PROFILES}))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        yield folder


def compiled(project: Path, profile: str, *overrides: str):
    inputs = ("engine=nemo_rl", "inputs.prompts=/lustre/p.jsonl", f"inputs.policy={project / 'llama8b'}",
              "inputs.judge_model=/lustre/judge", "output.dir=/lustre/run")  # fmt: skip
    request = RunRequest("rl/rlhf", "default", batch_profile=profile, dry_run=True, overrides=(*inputs, *overrides))
    return compile_request(load_catalog(), request)


def master_of(project: Path, profile: str = "h100", *overrides: str) -> dict:
    return yaml.safe_load(compiled(project, profile, *overrides).plan.files[MASTER_CONFIG_FILE])


def memory_note(project: Path, profile: str, *overrides: str) -> str:
    header = compiled(project, profile, *overrides).plan.files[MASTER_CONFIG_FILE].splitlines()
    (note,) = [line for line in header if line.startswith("#") and "memory per GPU" in line]
    return note


def training_terms(master: dict) -> dict[str, float]:
    phases, _ = policy_phases(master, shape_of(LLAMA_8B), count_parameters(shape_of(LLAMA_8B)), None)
    return {term.name: term.bytes for term in phases[0].terms}


def test_dtensor_holds_16_bytes_a_parameter_sharded_over_the_policy_gpus(project):
    """NeMo-RL's DTensor worker loads float32 master weights, FSDP2 keeps float32 grads beside them and AdamW two
    float32 states: 4 + 4 + 8, the 16 bytes a parameter of mixed-precision Adam (Rajbhandari et al. 2020, ZeRO,
    section 3.1: '16Ψ bytes of memory'), over the 8 GPUs the judge's node leaves the policy."""
    master = master_of(project)
    params = count_parameters(shape_of(LLAMA_8B))
    terms = training_terms(master)
    gathered = 2 * params.embedding * 2  # two FSDP2 units gathered in bf16: here the embedding's, the largest
    assert master["cluster"]["num_nodes"] * master["cluster"]["gpus_per_node"] == 8
    assert terms["weights"] - gathered + terms["gradients"] + terms["optimizer state"] == 16 * params.total / 8


@pytest.mark.parametrize(
    ("precision", "fp32_grads", "per_parameter"),
    [("bfloat16", False, 4 + 16 / 8), ("bfloat16", True, 6 + 12 / 8), ("float32", True, 8 + 8 / 8)],
)
def test_megatron_holds_what_megatron_lm_s_distributed_optimizer_table_says(project, precision, fp32_grads,
                                                                           per_parameter):  # fmt: skip
    """Megatron-LM's README, 'Distributed Optimizer': bytes a parameter 4 + 16/d (16-bit params and grads),
    6 + 12/d (bf16 params, fp32 grads), 8 + 8/d (fp32), d the data-parallel size (8 here)."""
    master = copy.deepcopy(master_of(project))
    policy = master["policy"]
    policy["precision"] = precision
    policy["dtensor_cfg"]["enabled"] = False
    policy["megatron_cfg"]["enabled"] = True
    policy["megatron_cfg"]["distributed_data_parallel_config"]["grad_reduce_in_fp32"] = fp32_grads
    terms = training_terms(master)
    held = terms["weights"] + terms["gradients"] + terms["optimizer state"]
    assert held == pytest.approx(per_parameter * count_parameters(shape_of(LLAMA_8B)).total)


def test_activations_are_what_torch_saves_for_backward():
    """transformers' Llama in bf16 over 256 tokens, the bytes autograd saves (parameters left out) against the
    DTensor rule: the layers within 5%, with activation checkpointing their inputs; of the logits, the log-softmax's
    float32 copy is saved, one of the three float32 copies the rule counts at the peak (the logits cast to float32
    and the gradient are the others)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    sizes = {"hidden_size": 256, "intermediate_size": 704, "num_attention_heads": 8, "num_key_value_heads": 2,
             "head_dim": 32, "num_hidden_layers": 4, "vocab_size": 2048, "tie_word_embeddings": False}  # fmt: skip
    model = LlamaForCausalLM(LlamaConfig(**sizes, attn_implementation="sdpa")).to(torch.bfloat16)
    tokens = torch.randint(0, sizes["vocab_size"], (1, 256))
    body = _saved(model, lambda: model.model(input_ids=tokens).last_hidden_state)
    whole = _saved(model, lambda: torch.log_softmax(model(input_ids=tokens).logits.float(), -1))
    master = {"policy": _bare_policy(tokens.shape[1]), "cluster": {"num_nodes": 1, "gpus_per_node": 1}}
    from rlsteps.nemo_rl import memory_terms

    shape = _shape_of({"model_type": "llama", **sizes}, "small")
    activations, rule_logits = memory_terms._activations(master, shape, count_parameters(shape))
    assert activations.bytes == pytest.approx(body, rel=0.05)
    head_input = tokens.shape[1] * sizes["hidden_size"] * 2  # the final norm's output, which the output layer saves
    assert whole - body - head_input == rule_logits.bytes / 3
    # activation checkpointing: each layer's input is saved (the final norm's float32 copy and output besides); the
    # rule adds the one layer recomputed in the backward pass
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    checkpointed = _saved(model, lambda: model.model(input_ids=tokens).last_hidden_state)
    master["policy"]["dtensor_cfg"]["activation_checkpointing"] = True
    rule, _ = memory_terms._activations(master, shape, count_parameters(shape))
    final_norm = tokens.shape[1] * sizes["hidden_size"] * (4 + 2)
    one_layer = activations.bytes / sizes["num_hidden_layers"]
    assert checkpointed - final_norm == pytest.approx(rule.bytes - one_layer, rel=0.01)


def _saved(model, forward) -> int:
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(saved.values())


def _bare_policy(length: int) -> dict:
    """The keys the activations read, for one sequence of `length` tokens on one GPU."""
    return {
        "precision": "bfloat16", "train_micro_batch_size": 1, "max_total_sequence_length": length,
        "train_global_batch_size": 1,
        "sequence_packing": {"enabled": False}, "dynamic_batching": {"enabled": False},
        "megatron_cfg": {"enabled": False},
        "dtensor_cfg": {"tensor_parallel_size": 1, "context_parallel_size": 1, "sequence_parallel": False,
                        "activation_checkpointing": False},
        "generation": {"colocated": {"enabled": True}},
    }  # fmt: skip


def test_the_dry_run_states_the_estimate_against_the_profile_s_gpu_memory(project):
    stated = memory_note(project, "h100")
    assert "training" in stated and "weights" in stated and "logits" in stated and "vLLM weights" in stated
    assert f"of the profile's gpu_memory_gib {H100:g}" in stated
    assert "request(s) of" in stated  # what vLLM's KV cache holds
    unstated = memory_note(project, "unstated")
    assert "the profile does not state gpu_memory_gib" in unstated


def test_a_config_over_the_gpu_memory_is_refused_with_its_largest_term_and_a_fix_that_fits(project):
    with pytest.raises(UsageError) as caught:
        compiled(project, "h100", "train.micro_batch_size=8")
    message, fix = caught.value.message, caught.value.fix
    assert "the largest term is activations" in message and f"gpu_memory_gib {H100:g}" in message
    assert fix.startswith("train.micro_batch_size=")
    note = memory_note(project, "h100", "train.micro_batch_size=8", *fix.split())
    assert f"of the profile's gpu_memory_gib {H100:g}" in note


def test_a_vllm_share_without_room_for_one_request_is_refused_as_vllm_refuses_it(project):
    with pytest.raises(UsageError) as caught:
        compiled(project, "h100", "rollout.vllm.gpu_memory_utilization=0.2")
    assert "vLLM refuses to start" in caught.value.message and "max_model_len" in caught.value.message
    assert caught.value.fix.startswith("rollout.vllm.gpu_memory_utilization=0.")
    compiled(project, "h100", "rollout.vllm.gpu_memory_utilization=0.2", *caught.value.fix.split())


def test_a_judge_whose_weights_leave_its_vllm_no_room_is_refused_with_a_share_that_holds_them(project):
    """The judge's vLLM on a node of its own: an 8B judge in bf16 (15 GiB at tensor parallel 1) over a share of
    0.15 x 79.6 GiB; the fix is the judge's share that leaves room for one request of its max_model_len."""
    share = f"nemo_rl.{JUDGE_KWARGS}.gpu_memory_utilization"
    judge = (f"inputs.judge_model={project / 'llama8b'}", f"{share}=0.15")
    with pytest.raises(UsageError) as caught:
        compiled(project, "h100", *judge)
    assert "the judge's vLLM would not start" in caught.value.message and "(judge)" in caught.value.message
    assert caught.value.fix.startswith(f"{share}=0.")
    note = memory_note(project, "h100", *judge, *caught.value.fix.split())
    assert "the judge's GPUs: judge" in note


def test_a_policy_not_read_here_or_not_counted_has_no_estimate(project, tmp_path):
    from rlsteps.nemo_rl.memory import check_memory

    master = master_of(project)
    (note,) = check_memory(master, "org/some-model", H100)
    assert note.startswith("no memory estimate per GPU") and "Hub id" in note
    latent = {**PUBLISHED[LLAMA_8B][0], "model_type": "deepseek_v3", "kv_lora_rank": 512}  # MLA: not counted
    (tmp_path / "config.json").write_text(json.dumps(latent))
    (note,) = check_memory(master, str(tmp_path), H100)
    assert note.startswith("no memory estimate per GPU") and "not a Llama-like text decoder" in note


@pytest.mark.slow  # NeMo-RL's own config loader, in a process of its own
def test_nemo_rl_s_published_placements_fit_80_gib_gpus():
    """NeMo-RL's example configs and recipes run on 80 GiB GPUs (its recipes say so: dpo-nanov3-30B3AB's 'on 80 GiB
    GPUs'): each must fit by the estimate; grpo_math_8B_megatron's comment says Llama-3.1-8B also runs at pp=1 on
    H100; the 32B recipe named actckpt-long needs its activation checkpointing (without it, over 80 GiB)."""
    import upstream

    root = upstream.unpacked("nemo_rl") / "examples" / "configs"
    cases = {
        "grpo_math_8B.yaml": LLAMA_8B,
        "grpo_math_8B_megatron.yaml": LLAMA_8B,
        "grpo_math_70B_megatron.yaml": "meta-llama/Llama-3.1-70B",  # Llama-3.3-70B: the same shape
        "grpo_math_1B.yaml": "Qwen/Qwen2.5-1.5B",
        "recipes/llm/grpo-qwen2.5-32b-32n8g-fsdp2tp8-actckpt-long.v3.yaml": "Qwen/Qwen2.5-32B",
    }
    for name, model in cases.items():
        master = upstream.load_nemo_rl_config(root / name)
        found = estimate(master, shape_of(model), H100 * GIB)
        assert found.peak.bytes < H100 * GIB and "request(s) of" in found.kv, (name, found)
        if name == "grpo_math_8B_megatron.yaml":
            master["policy"]["megatron_cfg"]["pipeline_model_parallel_size"] = 1
            assert estimate(master, shape_of(model), H100 * GIB).peak.bytes < H100 * GIB
        if "actckpt" in name:
            master["policy"]["dtensor_cfg"]["activation_checkpointing"] = False
            assert estimate(master, shape_of(model), H100 * GIB).peak.bytes > H100 * GIB


VLLM_SPEC = """
import json, sys, torch
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.core.kv_cache_utils import _check_enough_kv_cache_memory
from types import SimpleNamespace
out = []
for layers, kv_heads, head_size, tp, max_len in json.loads(sys.argv[1]):
    spec = FullAttentionSpec(block_size=16, num_kv_heads=max(1, kv_heads // tp), head_size=head_size,
                             dtype=torch.bfloat16)
    config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_len), max_in_flight_tokens=None,
                             parallel_config=SimpleNamespace(decode_context_parallel_size=1))
    needed = layers * spec.max_memory_usage_bytes(config)
    refused = []
    for available in (needed - 1, needed):
        try:
            _check_enough_kv_cache_memory(available, lambda: needed, max_len, lambda _: 0)
            refused.append(False)
        except ValueError:
            refused.append(True)
    out.append([layers * spec.page_size_bytes // 16, needed, refused])
print(json.dumps(out))
"""


@pytest.mark.slow  # vLLM's own classes, in its environment
def test_vllm_s_kv_cache_bytes_and_its_start_check_are_vllm_s_own():
    """vLLM's FullAttentionSpec (page_size_bytes, max_memory_usage_bytes) gives the KV cache a token and one request
    of max_model_len, and its _check_enough_kv_cache_memory refuses one byte less: the estimate says the same."""
    from rlsteps.nemo_rl.memory_terms import kv_cache_per_token, one_request
    from vllm_judge import vllm_python

    cases = [(32, 8, 128, 1, 4096), (32, 8, 128, 4, 8192), (30, 3, 64, 2, 2048)]  # Llama-3.1-8B, SmolLM2-135M
    done = subprocess.run([str(vllm_python()), "-c", VLLM_SPEC, json.dumps(cases)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    smollm2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
               "num_key_value_heads": 3, "head_dim": 64, "num_hidden_layers": 30, "vocab_size": 49152}  # fmt: skip
    for (layers, _, _, tp, max_len), (per_token, needed, refused) in zip(cases, json.loads(done.stdout)):
        shape = shape_of(LLAMA_8B) if layers == 32 else _shape_of(smollm2, "SmolLM2")
        assert kv_cache_per_token(shape, tp, 1, 2) == per_token
        assert one_request(per_token, max_len) == needed
        assert refused == [True, False]  # the estimate refuses below `needed`, as vLLM does
