import math
import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from model_fixtures import decoder_shape
from rlsteps.engine.config import RolloutConfig, SamplingConfig
from rlsteps.engine.data import Prompt
from rlsteps.engine.generation.backend import Generation, SamplingParams
from rlsteps.engine.generation.builtin import generate, sample_next_token, top_k_filter, top_p_filter
from rlsteps.engine.generation.rollouts import Sampler, build_rollout_batch, step_seed, tokenize_prompts
from rlsteps.engine.policy.logprobs import batched_token_logprobs

WORDS = "the a cat dog sat ran on under mat log red blue one two three and then stop".split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PROMPTS = [
    "the cat sat on the mat",
    "two",
    "a red dog ran under the blue log and then one cat sat",
    "three blue",
    "the dog",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE trained on synthetic sentences."""
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(400)]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|pad|>", "<|eos|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|pad|>", eos_token="<|eos|>", chat_template=CHAT_TEMPLATE
    )


def tiny_model(family: str, tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> torch.nn.Module:
    eos = tokenizer.eos_token_id
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=eos, eos_token_id=eos)
    shape = decoder_shape(hidden=48, positions=128)
    configs = {
        "llama": lambda: LlamaForCausalLM(LlamaConfig(**ids, **shape)),
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**ids, **shape)),
        "mistral": lambda: MistralForCausalLM(MistralConfig(**ids, **shape)),
        # GPT-2's small default init makes greedy text one repeated token; a wider init varies it
        "gpt2": lambda: GPT2LMHeadModel(
            GPT2Config(**ids, n_embd=48, n_layer=2, n_head=4, n_positions=128, initializer_range=0.2)
        ),
    }
    torch.manual_seed(seed)
    return configs[family]()


def prompt_ids(tokenizer, texts=PROMPTS) -> list[list[int]]:
    return tokenize_prompts([Prompt(id=str(i), text=t) for i, t in enumerate(texts)], tokenizer)


def hf_greedy(model, ids: list[int], max_new_tokens: int, eos: int, pad: int) -> list[int]:
    """Hugging Face's own greedy generate on one unpadded prompt, cut after the first EOS."""
    model.eval()
    out = model.generate(
        input_ids=torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    response = out[0, len(ids) :].tolist()
    return response[: response.index(eos) + 1] if eos in response else response


# ---------------------------------------------------------------------------------------------
# Filters and sampling


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    inf = math.inf
    assert torch.equal(top_k_filter(logits, 2), torch.tensor([[-inf, 3.0, 2.0, -inf], [-inf, -inf, 2.0, 3.0]]))
    assert torch.equal(top_k_filter(logits, 0), logits)
    assert torch.equal(top_k_filter(logits, 4), logits)
    ties = torch.tensor([[1.0, 2.0, 2.0, 0.0]])
    assert torch.equal(top_k_filter(ties, 1), torch.tensor([[-inf, 2.0, 2.0, -inf]]))


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3], [0.25, 0.25, 0.25, 0.25]])
    logits = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))  # noqa: E731
    assert kept(0.7).tolist() == [[False, True, False, True], [True, True, True, False]]
    assert kept(0.85).tolist() == [[True, True, False, True], [True, True, True, True]]
    assert kept(0.3).tolist() == [[False, True, False, False], [True, True, False, False]]
    assert kept(0.01).sum(-1).tolist() == [1, 1]  # the most likely token always survives
    assert torch.equal(top_p_filter(logits, 1.0), logits)
    assert torch.equal(top_p_filter(logits, 0.7)[0, [1, 3]], logits[0, [1, 3]])  # kept logits unchanged


def test_sampling_follows_the_tempered_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log().expand(20_000, 3)
    draws = sample_next_token(logits, SamplingParams(1, temperature=1.0), torch.Generator().manual_seed(0))
    assert torch.allclose(torch.bincount(draws, minlength=3) / 20_000, probs, atol=0.015)
    hot = SamplingParams(1, temperature=2.0)
    tempered = probs.sqrt() / probs.sqrt().sum()
    draws = sample_next_token(logits, hot, torch.Generator().manual_seed(0))
    assert torch.allclose(torch.bincount(draws, minlength=3) / 20_000, tempered, atol=0.015)
    draws = sample_next_token(logits, SamplingParams(1, top_k=1), torch.Generator().manual_seed(0))
    assert draws.eq(0).all()
    assert sample_next_token(torch.tensor([[0.0, 2.0, 1.0]]), SamplingParams(1, temperature=0), None).tolist() == [1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=4, temperature=-1.0), "temperature"),
        (dict(max_new_tokens=4, temperature=math.nan), "temperature"),
        (dict(max_new_tokens=4, top_p=0.0), "top_p"),
        (dict(max_new_tokens=4, top_p=1.5), "top_p"),
        (dict(max_new_tokens=4, top_k=-1), "top_k"),
    ],
)
def test_sampling_params_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


# ---------------------------------------------------------------------------------------------
# Generation


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "mistral"])
def test_greedy_matches_hf_generate(tokenizer, family):
    model = tiny_model(family, tokenizer)
    ids = prompt_ids(tokenizer)
    assert len({len(p) for p in ids}) >= 4  # mixed lengths, so left padding is exercised
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ours = generate(
        model,
        ids,
        SamplingParams(12, temperature=0),
        eos_token_id=eos,
        pad_token_id=pad,
        generator=torch.Generator().manual_seed(0),
        batch_size=3,
    )
    expected = [hf_greedy(model, p, 12, eos, pad) for p in ids]
    assert ours.response_ids == expected
    assert ours.is_end == [r[-1] == eos for r in expected]


def test_eos_stops_a_row_and_truncation_is_not_an_end(tokenizer):
    model = tiny_model("llama", tokenizer, seed=1)
    ids = prompt_ids(tokenizer)
    greedy = SamplingParams(8, temperature=0)
    pad = tokenizer.pad_token_id
    free = generate(model, ids, greedy, eos_token_id=pad, pad_token_id=pad, generator=torch.Generator())
    stop = free.response_ids[0][2]  # make the third greedy token of row 0 an end token
    stopped = generate(model, ids, greedy, eos_token_id=[pad, stop], pad_token_id=pad, generator=torch.Generator())
    for full, cut, ended in zip(free.response_ids, stopped.response_ids, stopped.is_end):
        ends = [i for i, t in enumerate(full) if t in (pad, stop)]
        assert cut == (full[: ends[0] + 1] if ends else full)
        assert ended == bool(ends)
        assert len(cut) == 8 or ended
    assert stopped.is_end[0] and len(stopped.response_ids[0]) <= 3
    assert not all(stopped.is_end)  # some row ran to max_new_tokens and reports no end


def test_same_generator_seed_gives_same_samples(tokenizer):
    model = tiny_model("qwen2", tokenizer)
    ids = prompt_ids(tokenizer)
    params = SamplingParams(10, temperature=1.0, top_p=0.95, top_k=50)

    def sample(seed: int) -> Generation:
        g = torch.Generator().manual_seed(seed)
        return generate(model, ids, params, eos_token_id=tokenizer.eos_token_id, pad_token_id=0, generator=g)

    torch.manual_seed(0)
    first = sample(3)
    torch.manual_seed(1)  # the global RNG plays no part
    assert sample(3) == first
    assert sample(4).response_ids != first.response_ids


def test_generate_restores_training_mode(tokenizer):
    model = tiny_model("gpt2", tokenizer)
    model.train()
    ids = prompt_ids(tokenizer)[:2]
    generate(model, ids, SamplingParams(2), eos_token_id=1, pad_token_id=0, generator=torch.Generator())
    assert model.training


@pytest.mark.parametrize(
    ("prompts", "eos", "batch_size", "message"),
    [
        ([[5] * 120], 1, 8, "a prompt of 120 tokens plus max_new_tokens=9 exceeds the model's context of 128"),
        ([[5], []], 1, 8, "every prompt needs at least one token"),
        ([[5]], [], 8, "eos_token_id is an empty list"),
        ([[5]], 1, 0, "batch_size must be at least 1"),
    ],
)
def test_unusable_generate_arguments_are_clear_errors(tokenizer, prompts, eos, batch_size, message):
    model = tiny_model("llama", tokenizer)
    with pytest.raises(ValueError, match=message):
        generate(
            model,
            prompts,
            SamplingParams(9),
            eos_token_id=eos,
            pad_token_id=0,
            generator=torch.Generator(),
            batch_size=batch_size,
        )


# ---------------------------------------------------------------------------------------------
# Rollout batch


def test_rollout_batch_layout_and_gen_logprobs_match_recomputed_logprobs(tokenizer):
    model = tiny_model("llama", tokenizer, seed=2)
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        for t in PROMPTS
    ]
    prompts = [Prompt(id=f"p{i % 2}", text=t) for i, t in enumerate(texts)]
    ids = tokenize_prompts(prompts, tokenizer)
    # tempered and filtered sampling; the logprobs must still be those of the raw distribution
    params = SamplingParams(10, temperature=0.7, top_k=40, top_p=0.9)
    generation = generate(
        model,
        ids,
        params,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(0),
        batch_size=2,
    )
    batch = build_rollout_batch(prompts, ids, generation, tokenizer)

    assert batch.tokens.shape[1] == max(len(p) + len(r) for p, r in zip(ids, generation.response_ids))
    for i, (p, r) in enumerate(zip(ids, generation.response_ids)):
        assert batch.tokens[i, : len(p) + len(r)].tolist() == p + r
        assert batch.tokens[i, len(p) + len(r) :].eq(tokenizer.pad_token_id).all()
        assert batch.response_texts[i] == tokenizer.decode(r, skip_special_tokens=True)
    assert batch.prompt_ids == [p.id for p in prompts] and batch.prompt_texts == texts
    assert batch.is_end.tolist() == generation.is_end
    assert batch.response_lengths.tolist() == [len(r) for r in generation.response_ids]

    mask = batch.response_mask()
    assert batch.gen_logprobs[mask == 0].eq(0).all()
    recomputed = batched_token_logprobs(model, batch, micro_batch_size=2)
    assert torch.allclose(recomputed * mask, batch.gen_logprobs, atol=1e-4)
    assert batch.gen_logprobs[mask == 1].lt(0).all()


def test_response_texts_skip_special_tokens(tokenizer):
    prompts = [Prompt(id="a", text="the cat")]
    ids = tokenize_prompts(prompts, tokenizer)
    response = tokenizer(" sat", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    generation = Generation(response_ids=[response], is_end=[True], logprobs=[[-1.0] * len(response)])
    batch = build_rollout_batch(prompts, ids, generation, tokenizer)
    assert batch.response_texts == [" sat"]
    assert batch.gen_logprobs[0, len(ids[0]) - 1 :].tolist() == [-1.0] * len(response)


def test_rollout_batch_rejects_mismatched_inputs(tokenizer):
    generation = Generation(response_ids=[[1]], is_end=[True], logprobs=[[-0.5]])
    with pytest.raises(ValueError, match="one of each per rollout"):
        build_rollout_batch([Prompt("a", "x"), Prompt("b", "y")], [[3], [4]], generation, tokenizer)


# ---------------------------------------------------------------------------------------------
# Sampler


class RecordingBackend:
    """A GenerationBackend that answers every prompt with one token and EOS, and records what it was asked."""

    def __init__(self, eos: int) -> None:
        self.eos = eos
        self.calls: list[tuple[list[list[int]], SamplingParams, int]] = []

    def generate(self, model, prompt_token_ids, params, seed):
        self.calls.append((prompt_token_ids, params, seed))
        rows = len(prompt_token_ids)
        return Generation(response_ids=[[7, self.eos]] * rows, is_end=[True] * rows, logprobs=[[-0.5, -0.25]] * rows)


ROLLOUT = RolloutConfig(
    generation_batch_size=2, sampling=SamplingConfig(max_new_tokens=6, temperature=0.8, top_p=0.9, top_k=5)
)


def test_sampler_asks_its_backend_for_n_adjacent_rows_per_prompt_with_the_step_seed(tokenizer):
    backend = RecordingBackend(tokenizer.eos_token_id)
    sampler = Sampler(tokenizer, ROLLOUT, torch.device("cpu"), backend=backend)
    prompts = [Prompt(id="a", text="the cat"), Prompt(id="b", text="two")]
    batch = sampler.rollouts(None, prompts, 3, seed=(5, 2))
    token_ids, params, seed = backend.calls[-1]
    assert token_ids == [ids for ids in tokenize_prompts(prompts, tokenizer) for _ in range(3)]
    assert params == SamplingParams(6, temperature=0.8, top_p=0.9, top_k=5) and seed == step_seed(5, 2)
    assert batch.prompt_ids == ["a", "a", "a", "b", "b", "b"] and batch.is_end.all()

    sampler.validation_rollouts(None, prompts, 1, max_new_tokens=None, seed=5)
    assert backend.calls[-1][1:] == (SamplingParams(6, temperature=0.0, top_p=0.9, top_k=5), step_seed(5, -1))
    sampler.validation_rollouts(None, prompts, 2, max_new_tokens=3, seed=5)
    assert backend.calls[-1][1] == SamplingParams(3, temperature=0.8, top_p=0.9, top_k=5)


def test_sampler_defaults_to_the_builtin_sampler_seeded_per_step(tokenizer):
    model = tiny_model("llama", tokenizer)
    prompts = [Prompt(id=str(i), text=t) for i, t in enumerate(PROMPTS[:3])]
    batch = Sampler(tokenizer, ROLLOUT, torch.device("cpu")).rollouts(model, prompts, 2, seed=(0, 4))
    token_ids = [ids for ids in prompt_ids(tokenizer, PROMPTS[:3]) for _ in range(2)]
    expected = generate(
        model,
        token_ids,
        SamplingParams(6, temperature=0.8, top_p=0.9, top_k=5),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(step_seed(0, 4)),
        batch_size=2,
    )
    assert batch.response_lengths.tolist() == [len(r) for r in expected.response_ids]
    assert batch.is_end.tolist() == expected.is_end
    for row, (p, r) in enumerate(zip(token_ids, expected.response_ids)):
        assert batch.tokens[row, : len(p) + len(r)].tolist() == p + r
