import math

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from model_fixtures import decoder_shape
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.policy.logprobs import batched_token_logprobs, token_logprobs
from rlsteps.engine.policy.model import frozen_copy, load_policy, save_policy
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler, lr_multiplier, optimizer_step

VOCAB = 40


def llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=1, **decoder_shape())
    return LlamaForCausalLM(config)


def gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=1
    )
    return GPT2LMHeadModel(config)


def right_padded(rows: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    tokens = torch.tensor([row + [pad_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return tokens, mask


def rollout_batch(rows: list[list[int]], prompt_lengths: list[int]) -> RolloutBatch:
    tokens, _ = right_padded(rows)
    return RolloutBatch(
        tokens=tokens,
        prompt_lengths=torch.tensor(prompt_lengths),
        response_lengths=torch.tensor([len(r) - p for r, p in zip(rows, prompt_lengths)]),
        is_end=torch.ones(len(rows), dtype=torch.bool),
        prompt_ids=[str(i) for i in range(len(rows))],
        prompt_texts=[""] * len(rows),
        response_texts=[""] * len(rows),
        pad_id=0,
    )


ROWS = [[5, 9, 3, 7, 2], [4, 4, 8, 11, 12, 13, 30, 2, 6, 1], [17, 3], [21, 22, 23, 24, 25, 26, 27]]


# ---------------------------------------------------------------------------------------------
# Log-probs


def test_token_logprobs_scores_the_next_token_in_fp32():
    model = llama().eval()
    tokens = torch.tensor([ROWS[1]])
    logprobs = token_logprobs(model, tokens, torch.ones_like(tokens))
    assert logprobs.shape == (1, len(ROWS[1]) - 1) and logprobs.dtype == torch.float32
    with torch.no_grad():
        expected = model(tokens).logits[0].log_softmax(-1)  # row t predicts token t+1
    for t in range(len(ROWS[1]) - 1):
        assert logprobs[0, t].item() == pytest.approx(expected[t, ROWS[1][t + 1]].item(), abs=1e-6)
    assert logprobs.requires_grad  # the trainer differentiates through it
    half = token_logprobs(llama().to(torch.bfloat16), tokens, torch.ones_like(tokens))
    assert half.dtype == torch.float32


@pytest.mark.parametrize("make_model", [llama, gpt2])
def test_padding_does_not_change_a_row(make_model):
    model = make_model().eval()
    tokens, mask = right_padded(ROWS)
    with torch.no_grad():
        batched = token_logprobs(model, tokens, mask)
        for i, row in enumerate(ROWS):
            alone = token_logprobs(model, torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long))
            assert torch.allclose(batched[i, : len(row) - 1], alone[0], atol=1e-5)
            assert batched[i, len(row) - 1 :].eq(0).all()  # predictions of padding are zeroed


def test_batched_token_logprobs_full_width_no_grad_and_mode_restored():
    model = llama()
    model.train()
    batch = rollout_batch(ROWS, prompt_lengths=[2, 3, 1, 4])
    with torch.no_grad():
        model.eval()
        expected = token_logprobs(model, batch.tokens, batch.attention_mask()) * batch.response_mask()
        model.train()  # the batched form scores the response positions only
    for micro_batch_size in (1, 3, 8):
        got = batched_token_logprobs(model, batch, micro_batch_size)
        assert got.shape == (4, batch.tokens.shape[1] - 1) and not got.requires_grad
        assert torch.allclose(got, expected, atol=1e-5)
    assert model.training


def test_frozen_copy_is_independent_and_frozen():
    model = llama()
    model.train()
    frozen = frozen_copy(model, device="cpu")
    assert not frozen.training and all(not p.requires_grad for p in frozen.parameters())
    assert model.training and all(p.requires_grad for p in model.parameters())
    before = frozen.lm_head.weight.clone()
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert torch.equal(frozen.lm_head.weight, before)


# ---------------------------------------------------------------------------------------------
# Optimiser and schedule


def test_optimizer_decays_matrices_only():
    model = gpt2()
    model.transformer.wpe.weight.requires_grad_(False)
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert decay["betas"] == (0.9, 0.98) and decay["eps"] == 1e-8 and decay["lr"] == 1e-3
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert "transformer.ln_f.weight" in no_decay_names and "transformer.h.0.attn.c_attn.bias" in no_decay_names
    assert all(p.ndim == 1 for p in no_decay["params"]) and all(p.ndim == 2 for p in decay["params"])
    grouped = [id(p) for g in optimizer.param_groups for p in g["params"]]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert sorted(grouped) == sorted(trainable)  # every trainable parameter once, the frozen one not at all


@pytest.mark.parametrize(
    ("schedule", "step", "expected"),
    [
        ("cosine", 0, 0.25),  # warmup: the first update already moves
        ("cosine", 3, 1.0),
        ("cosine", 4, 1.0),  # decay starts from the peak
        ("cosine", 6, 0.1 + 0.9 * 0.5 * (1 + math.cos(0.2 * math.pi))),
        ("cosine", 9, 0.55),
        ("cosine", 14, 0.1),
        ("cosine", 50, 0.1),  # flat after total_steps
        ("linear", 1, 0.5),
        ("linear", 6, 0.82),
        ("linear", 14, 0.1),
        ("constant", 2, 0.75),
        ("constant", 13, 1.0),
    ],
)
def test_lr_multiplier_at_hand_picked_steps(schedule, step, expected):
    got = lr_multiplier(step, warmup_steps=4, total_steps=14, schedule=schedule, min_lr_ratio=0.1)
    assert got == pytest.approx(expected)


def test_no_warmup_starts_at_the_peak():
    assert lr_multiplier(0, warmup_steps=0, total_steps=10) == 1.0
    assert lr_multiplier(10, warmup_steps=0, total_steps=10, min_lr_ratio=0.0) == pytest.approx(0.0)


def test_scheduler_drives_the_optimizer_lr():
    model = llama()
    optimizer = build_optimizer(model, lr=2e-3, weight_decay=0.0)
    scheduler = build_scheduler(optimizer, warmup_steps=4, total_steps=14, schedule="linear")
    seen = []
    for _ in range(7):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [2e-3 * lr_multiplier(s, warmup_steps=4, total_steps=14, schedule="linear") for s in range(7)]
    assert seen == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(warmup_steps=1, total_steps=10, schedule="step"), "unknown lr schedule 'step'"),
        (dict(warmup_steps=-1, total_steps=10), "warmup_steps"),
        (dict(warmup_steps=1, total_steps=0), "total_steps"),
        (dict(warmup_steps=1, total_steps=10, min_lr_ratio=1.5), "min_lr_ratio"),
    ],
)
def test_scheduler_arguments_are_validated(kwargs, message):
    optimizer = build_optimizer(llama(), lr=1e-3, weight_decay=0.0)
    with pytest.raises(ValueError, match=message):
        build_scheduler(optimizer, **kwargs)


def _loss(model: torch.nn.Module) -> torch.Tensor:
    tokens, mask = right_padded(ROWS[:2])
    return -token_logprobs(model, tokens, mask).sum()


def test_optimizer_step_clips_steps_and_returns_the_pre_clip_norm():
    model = llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the update is the clipped gradient itself
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    _loss(model).backward()
    norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    assert norm > 0.5
    returned = optimizer_step(model, optimizer, scheduler, max_grad_norm=0.5)
    assert returned == pytest.approx(norm, rel=1e-5)
    update = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    assert update.norm().item() == pytest.approx(0.5, rel=1e-4)
    assert all(p.grad is None for p in model.parameters())
    assert scheduler.last_epoch == 1


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_gradients_skip_the_update(bad):
    model = llama()
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=10)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _loss(model).backward()
    model.lm_head.weight.grad[0, 0] = bad
    norm = optimizer_step(model, optimizer, scheduler, max_grad_norm=1.0)
    assert not math.isfinite(norm)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())
    assert scheduler.last_epoch == 0 and not optimizer.state
    _loss(model).backward()  # the next, healthy step goes through
    assert math.isfinite(optimizer_step(model, optimizer, scheduler, max_grad_norm=1.0))
    assert not torch.equal(model.lm_head.weight, before["lm_head.weight"])


# ---------------------------------------------------------------------------------------------
# Save and load


def word_tokenizer_without_pad() -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="w1", unk_token="w0")


def test_save_then_load_round_trips_and_pads_with_eos(tmp_path):
    model, tokenizer = llama(), word_tokenizer_without_pad()
    save_policy(model, tokenizer, tmp_path / "policy")
    assert (tmp_path / "policy" / "model.safetensors").is_file()
    loaded, loaded_tokenizer = load_policy(tmp_path / "policy")
    assert loaded_tokenizer.pad_token == "w1" and loaded_tokenizer.pad_token_id == 1
    assert loaded_tokenizer("w5 w7")["input_ids"] == [5, 7]
    tokens = torch.tensor([ROWS[0]])
    with torch.no_grad():
        assert torch.allclose(loaded(tokens).logits, model.eval()(tokens).logits, atol=1e-6)
    half, _ = load_policy(tmp_path / "policy", dtype=torch.bfloat16)
    assert half.lm_head.weight.dtype == torch.bfloat16


def test_load_policy_from_a_non_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="neither a Hugging Face model directory .* nor a Megatron checkpoint"):
        load_policy(tmp_path)
