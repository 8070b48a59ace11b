"""Each model family users bring trains on the embedded engine: a two-step rl/reinforce on the built-in sampler, whole
and with LoRA adapters, per family of tests/family_models.py, the sampler's log-probs the trainer's
(train/token_mult_prob_error within 1% of 1); and per family, what the engine decides about it: whether its forward
keeps packed sequences apart (train.sequence_packing), and which layers LoRA adapts by default.

The families' random weights would almost never sample EOS (1 token in 578), and a rollout that does not end teaches
REINFORCE nothing: `family_policy` gives each a constant channel in its token embeddings and raises its EOS logit
along it, to about a 1 in 10 chance per token.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from family_models import FAMILIES, family_config
from run_helpers import FAST, rlsteps, run_dir, series, weights

FAMILY_NAMES = list(FAMILIES)
EOS_PER_TOKEN = 0.1  # the chance of EOS at each position, on average over random tokens
# the constant embedding channel, in spreads of the other dimensions: Gemma 3's norms after attention and MLP add
# unit-size outputs to the residual stream, which drown a smaller one (its EOS chance 0 to 0.9 from token to token)
EOS_CHANNEL = {"gemma3": 20.0}
TWO_STEPS = [
    "output.type=checkpoint_hf",
    "train.max_steps=2",
    "rollout.prompts_per_step=2",
    "rollout.num_rollouts_per_prompt=2",
    "rollout.sampling.max_new_tokens=16",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
    "validation.interval=0",
    "checkpoint.interval=0",
    *FAST,
]
MAX_PROB_ERROR = 1.01  # train/token_mult_prob_error: 1.0 is exact agreement
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
DENSE_MLP = ["gate_proj", "up_proj", "down_proj"]
# what LoRA adapts when train.lora.target_modules is empty: never the output layer, Qwen3-MoE's router or its fused
# experts (3-D parameters, not nn.Linear), nor Nemotron-H's Mamba out_proj (its kernels read it bare; peft refuses it)
LORA_TARGETS = {
    "llama3": ATTENTION + DENSE_MLP,
    "mistral": ATTENTION + DENSE_MLP,
    "qwen2.5": ATTENTION + DENSE_MLP,
    "qwen3": ATTENTION + DENSE_MLP,
    "qwen3_moe": ATTENTION,
    "gemma3": ATTENTION + DENSE_MLP,
    "nemotron_h": ["in_proj", *ATTENTION, "up_proj", "down_proj"],
}
# whether packed rows give the padded rows' log-probs; Nemotron-H's Mamba layers carry state across sequences
PACKS = {family: family != "nemotron_h" for family in FAMILY_NAMES}


def family_policy(family: str, tokenizer_dir: Path, out_dir: Path, **fields) -> Path:
    """A tiny random `family` model (tests/family_models.py, `fields` over its config) that ends its responses."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = family_config(family, tokenizer)
    for key, value in fields.items():
        setattr(config, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    ends_responses(model, tokenizer.eos_token_id, EOS_CHANNEL.get(family, 5.0))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@torch.no_grad()
def ends_responses(model: torch.nn.Module, eos: int, channel: float) -> None:
    """Embedding dimension 0 a constant, `channel` times the others' spread, so the final hidden states carry it, and
    the EOS row of the output layer raised along it until EOS has EOS_PER_TOKEN of the probability (bisection)."""
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    embedding[:, 0] = embedding[:, 1:].std() * channel
    tokens = torch.randint(0, embedding.shape[0], (8, 24), generator=torch.Generator().manual_seed(0))
    base, low, high = head[eos, 0].item(), -20.0, 20.0
    for _ in range(30):
        head[eos, 0] = base + (low + high) / 2
        chance = model(input_ids=tokens).logits.softmax(-1)[..., eos].mean().item()
        low, high = (head[eos, 0].item() - base, high) if chance < EOS_PER_TOKEN else (low, head[eos, 0].item() - base)
    assert math.isclose(chance, EOS_PER_TOKEN, rel_tol=0.05), chance


@pytest.fixture(scope="module")
def policies(tiny_world, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: family_policy(family, tiny_world.policy, root / family) for family in FAMILY_NAMES}


def load(path: Path) -> torch.nn.Module:
    from rlsteps.engine.policy.model import load_policy

    return load_policy(path)[0]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_packing_probe_gives_each_familys_verdict_with_and_without_adapters(family, policies, caplog):
    from rlsteps.contract.config import LoraConfig
    from rlsteps.engine.policy.logprobs import reads_packed_sequences
    from rlsteps.engine.policy.lora import apply_lora

    cpu = torch.device("cpu")
    with caplog.at_level(logging.WARNING, logger="rlsteps.engine.policy.logprobs"):
        assert reads_packed_sequences(load(policies[family]), cpu) is PACKS[family]
        # peft's forward names no use_cache: the engine passes it through, so no KV cache joins the sequences
        adapted = apply_lora(load(policies[family]), LoraConfig(enabled=True), seed=0)
        assert reads_packed_sequences(adapted, cpu) is PACKS[family]
    if not PACKS[family]:
        assert "NemotronHForCausalLM (nemotron_h)" in caplog.text and "with LoRA adapters" in caplog.text
        assert "Mamba layers carry their state from one packed sequence into the next" in caplog.text
    else:
        assert "train.sequence_packing" not in caplog.text


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_lora_adapts_each_familys_attention_and_mlp_projections_by_default(family, policies):
    from peft.tuners.lora import LoraLayer

    from rlsteps.contract.config import LoraConfig
    from rlsteps.engine.policy.lora import apply_lora, default_target_modules

    model = load(policies[family])
    assert default_target_modules(model) == LORA_TARGETS[family]
    adapted = apply_lora(model, LoraConfig(enabled=True), seed=0)
    layers = {name.rsplit(".", 1)[-1] for name, module in adapted.named_modules() if isinstance(module, LoraLayer)}
    assert layers == set(LORA_TARGETS[family])


def two_step_run(family: str, policy: Path, cwd: Path, *extra: str, python=None) -> Path:
    """A two-step rl/reinforce from `policy`; its run directory, after checking it finished, wrote its output and
    sampled as the trainer scores."""
    cwd.mkdir()
    options = {"python": python} if python else {}
    done = rlsteps("run", "rl/reinforce", "-c", "tiny", f"inputs.policy={policy}", *TWO_STEPS, *extra, cwd=cwd,
                   **options)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(cwd, "rl_reinforce")
    assert (run / "policy" / "config.json").is_file() and (run / "policy" / "model.safetensors").is_file()
    assert series(run, "train/optimizer_steps") == [1, 2], family  # both steps trained
    errors = series(run, "train/token_mult_prob_error")
    assert len(errors) == 2 and all(1.0 <= e < MAX_PROB_ERROR for e in errors), (family, errors)
    packing_off = "train.sequence_packing: the log-probs of" in done.stderr
    assert packing_off is not PACKS[family], done.stderr[-3000:]
    return run


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_two_step_run_trains_each_family_on_the_built_in_sampler(family, policies, tmp_path):
    run = two_step_run(family, policies[family], tmp_path / "run")
    trained, initial = weights(run / "policy"), load_file(str(policies[family] / "model.safetensors"))
    assert trained.keys() == initial.keys()
    assert all(trained[k].dtype == initial[k].dtype for k in trained)
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_two_step_lora_run_trains_each_familys_adapters_and_leaves_its_base_weights(family, policies, tmp_path):
    run = two_step_run(family, policies[family], tmp_path / "run", "train.lora.enabled=true", "train.lr=3e-3")
    adapters = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    # as the model names them (Nemotron-H's checkpoint says backbone, its model and peft say model)
    trained, initial = load(run / "policy").state_dict(), load(policies[family]).state_dict()
    assert trained.keys() == initial.keys()
    deltas = merged_deltas(adapters, scaling=32 / 8)  # train.lora's default alpha / dim
    assert {name.rsplit(".", 2)[-2] for name in deltas} == set(LORA_TARGETS[family])
    assert all(delta.abs().max() > 0 for delta in deltas.values())  # B starts at zero: every adapter trained
    for name, tensor in initial.items():  # the output is the frozen base plus the adapters, and nothing else
        expected = tensor + deltas[name] if name in deltas else tensor
        torch.testing.assert_close(trained[name], expected, rtol=0, atol=1e-6, msg=name)


def merged_deltas(adapters: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """Base weight name -> scaling * B A, from the adapters as peft saves them."""
    deltas = {}
    for name, a in adapters.items():
        if ".lora_A." in name:
            b = adapters[name.replace(".lora_A.", ".lora_B.")]
            base = name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            deltas[base] = scaling * (b @ a)
    return deltas
