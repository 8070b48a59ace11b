"""LoRA on the policy (train.lora, through peft): what trains, what the reference is, what the samplers and the
checkpoints get, and what the run writes. A small random Qwen2 with tied embeddings (tests/distributed_update.py)
trained by the engine's own PolicyUpdate."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from distributed_update import VOCAB, config, fixed_batch, fixed_model  # noqa: E402
from rlsteps.contract.config import LoraConfig, ReinforceConfig  # noqa: E402
from rlsteps.engine.algorithms.reinforce import ReinforceRLOO  # noqa: E402
from rlsteps.engine.algorithms.rs import RejectionSampling  # noqa: E402
from rlsteps.engine.policy.logprobs import batched_token_logprobs, reads_packed_sequences  # noqa: E402
from rlsteps.engine.policy.lora import adapters_off, apply_lora, merged_parameters  # noqa: E402
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler  # noqa: E402
from rlsteps.engine.run.update import PolicyUpdate, longest_row  # noqa: E402
from rlsteps.errors import UsageError  # noqa: E402

LORA = LoraConfig(enabled=True, dim=4, alpha=8)


def adapted(settings: LoraConfig = LORA, seed: int = 7) -> torch.nn.Module:
    return apply_lora(fixed_model(), settings, seed)


def trainer(model: torch.nn.Module):
    cfg = config(8, 8, 4)
    optimizer = build_optimizer(model, 1e-2, 0.0)
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=10)
    return PolicyUpdate(model, optimizer, scheduler, RejectionSampling(cfg), cfg.train, torch.device("cpu"))


def train(update: PolicyUpdate, steps: int) -> None:
    for _ in range(steps):
        update(fixed_batch(8))


def test_only_the_adapters_train_and_only_they_sit_in_the_optimizer():
    model = adapted()
    update = trainer(model)
    in_optimizer = {id(p) for group in update.optimizer.param_groups for p in group["params"]}
    adapters = {id(p) for name, p in model.named_parameters() if ".lora_" in name}
    assert in_optimizer == adapters and len(adapters) == 2 * 7 * 2  # A and B of 7 linear layers a block, 2 blocks
    base_before = {name: p.detach().clone() for name, p in model.named_parameters() if ".lora_" not in name}
    train(update, 2)
    after = dict(model.named_parameters())
    assert all(torch.equal(after[name], value) for name, value in base_before.items())
    assert any(after[name].abs().sum() > 0 for name in after if ".lora_B" in name)  # the adapters moved off zero


def test_the_adapters_start_from_the_seed_with_b_at_zero_so_the_policy_starts_as_the_base():
    one, again, other = adapted(seed=1), adapted(seed=1), adapted(seed=2)
    a = {n: p for n, p in one.named_parameters() if ".lora_A" in n}
    assert all(torch.equal(a[n], p) for n, p in again.named_parameters() if n in a)
    assert any(not torch.equal(a[n], p) for n, p in other.named_parameters() if n in a)
    tokens = fixed_batch(4).tokens
    with torch.no_grad():
        assert torch.equal(one(input_ids=tokens).logits, fixed_model()(input_ids=tokens).logits)


def test_the_reference_is_the_base_with_the_adapters_off():
    from rlsteps.engine.run.step import Counters, StepRun

    model = adapted()
    train(trainer(model), 2)
    cfg = ReinforceConfig.model_validate(
        {"algorithm": "reinforce", "inputs": {"prompts": "-", "policy": "-"}, "output": {"dir": "-"}}
    )
    run = StepRun(cfg, ReinforceRLOO(cfg), None, model, None, None, None, None, Counters(), torch.device("cpu"), None)
    batch = fixed_batch(6)
    reference = run._reference()(batch)
    # the pass packs its rows (the adapted policy reads packed sequences as the base does), as the base's own does
    assert run.cfg.train.sequence_packing and reads_packed_sequences(model, torch.device("cpu"))
    assert torch.equal(reference, batched_token_logprobs(fixed_model(), batch, 8, longest_row(run.cfg)))
    assert not torch.equal(reference, run._logprobs(model)(batch))
    with adapters_off(model):
        pass
    assert not torch.equal(reference, batched_token_logprobs(model, batch, 8))  # the adapters are on again


def test_vllm_is_sent_the_base_models_weights_with_the_adapters_merged_in():
    model = adapted()
    train(trainer(model), 2)
    merged = dict(merged_parameters(model))
    plain = fixed_model()
    assert list(merged) == [name for name, _ in plain.named_parameters()]
    plain.load_state_dict(merged, strict=False)  # the tied head shares the embedding's weight
    batch = fixed_batch(6)
    with torch.no_grad():
        torch.testing.assert_close(
            batched_token_logprobs(plain, batch, 8), batched_token_logprobs(model, batch, 8), rtol=0, atol=2e-5
        )


def test_target_modules_that_match_no_layer_say_which_layers_there_are():
    with pytest.raises(UsageError, match=r"matches no layer.*'q_proj', 'k_proj'"):
        adapted(LoraConfig(enabled=True, target_modules=["query"]))
    only_q = adapted(LoraConfig(enabled=True, target_modules=["q_proj"]))
    assert {n.split(".")[-4] for n, p in only_q.named_parameters() if p.requires_grad} == {"q_proj"}


def test_a_step_checkpoint_holds_the_adapters_and_their_optimizer_state_only_and_resumes_bitwise(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    from rlsteps.engine.checkpoints.train_state import read_train_state, write_train_state

    model = adapted()
    update = trainer(model)
    train(update, 2)
    write_train_state(model, update.optimizer, tmp_path / "state")
    saved = FileSystemReader(str(tmp_path / "state")).read_metadata().state_dict_metadata
    weights = [key for key in saved if key.startswith("model.")]
    assert weights and all(".lora_" in key for key in weights), [k for k in weights if ".lora_" not in k]
    moments = {key.split(".")[-1] for key in saved if key.startswith("optimizer.state.")}
    assert moments == {"step", "exp_avg", "exp_avg_sq"}
    train(update, 2)

    fresh = adapted(seed=99)  # other adapters: everything the run trained comes from the checkpoint
    resumed = trainer(fresh)
    read_train_state(fresh, resumed.optimizer, tmp_path / "state")
    resumed.scheduler.load_state_dict(update.scheduler.state_dict() | {"last_epoch": 2, "_step_count": 3})
    train(resumed, 2)
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        assert torch.equal(a, b), name
    for a, b in zip(update.optimizer.state.values(), resumed.optimizer.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def test_the_output_is_the_merged_policy_and_peft_reads_the_adapter_folder_beside_it(tmp_path):
    from peft import PeftModel

    from model_fixtures import build_tokenizer
    from rlsteps.contract.config import OutputConfig
    from rlsteps.engine.records.output import write_policy_output

    model = adapted()
    train(trainer(model), 2)
    batch = fixed_batch(6)
    expected = batched_token_logprobs(model, batch, 8).detach()
    cfg = ReinforceConfig.model_validate(
        {"algorithm": "reinforce", "inputs": {"prompts": "-", "policy": "-"}, "output": {"dir": str(tmp_path)}}
    ).model_copy(update={"output": OutputConfig(dir=str(tmp_path), type="checkpoint_hf")})
    write_policy_output(cfg, model, build_tokenizer(vocab_size=VOCAB), {"step": 2}, {}, {})

    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert {n for n, _ in merged.named_parameters()} == {n for n, _ in fixed_model().named_parameters()}
    torch.testing.assert_close(batched_token_logprobs(merged, batch, 8), expected, rtol=0, atol=2e-5)
    with_adapter = PeftModel.from_pretrained(fixed_model(), tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert torch.equal(batched_token_logprobs(with_adapter, batch, 8), expected)


def test_the_built_in_sampler_samples_the_adapted_policy_through_its_base_models_own_arguments():
    """Through a peft model the sampler passes the cache under the base model's name for it and asks for the last
    logits only: the same tokens and log-probs as the merged model, and no deprecated argument."""
    import warnings

    from rlsteps.engine.generation.backend import SamplingParams
    from rlsteps.engine.generation.builtin import _accepts_logits_to_keep, cache_keyword, generate

    model = adapted()
    train(trainer(model), 2)
    plain = fixed_model()
    plain.load_state_dict(dict(merged_parameters(model)), strict=False)
    assert (cache_keyword(model), _accepts_logits_to_keep(model)) == (cache_keyword(plain), True)
    prompts, params = [[5, 6, 7], [9, 10]], SamplingParams(max_new_tokens=6, temperature=1.0)
    sample = dict(eos_token_id=1, pad_token_id=0, seeds=[3, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with torch.no_grad():
            adapted_sample = generate(model.eval(), prompts, params, **sample)
    with torch.no_grad():
        merged_sample = generate(plain.eval(), prompts, params, **sample)
    assert adapted_sample.response_ids == merged_sample.response_ids
    for a, b in zip(adapted_sample.logprobs, merged_sample.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=2e-5)
