import math
import random
import re

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
from rlsteps.contract.config import RolloutConfig, SamplingConfig
from rlsteps.contract.prompts import Prompt
from rlsteps.engine.generation.backend import Generation, SamplingParams
from rlsteps.engine.generation.builtin import DecodeOptions, PreallocatedLayer, generate, preallocated_cache
from rlsteps.engine.generation.rollouts import (
    Sampler,
    build_rollout_batch,
    rollout_seeds,
    row_seed,
    step_seed,
    tokenize_prompts,
)
from rlsteps.engine.generation.sampling import (
    SCAN_BLOCK,
    row_cumsum,
    sample_next_token,
    token_from_uniform,
    top_k_filter,
    top_k_weights,
    top_p_filter,
)
from rlsteps.engine.generation.uniforms import position_uniforms, splitmix64, splitmix64_stream
from rlsteps.engine.policy.logprobs import batched_token_logprobs
from rlsteps.engine.policy.sampled_distribution import SampledDistribution
from rlsteps.tiny import task as tiny_task
from rlsteps.tiny.models import build_random_causal_lm
from rlsteps.tiny.tokenizer import chat_prompt, train_tokenizer

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


@pytest.fixture(scope="module")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny task's own tokenizer (BPE, chat template), trained on a small corpus."""
    return train_tokenizer(tiny_task.tokenizer_corpus(random.Random(0), 200))


@pytest.fixture(scope="module")
def tiny_qwen2(tiny_tokenizer) -> torch.nn.Module:
    return build_random_causal_lm("qwen2", tiny_tokenizer, seed=3)


def tiny_prompts(tokenizer, count: int) -> list[Prompt]:
    """Chat prompts of the tiny task, shortest to longest, so that batching pads them differently."""
    by_length = sorted(tiny_task.all_prompts(), key=len)
    texts = [by_length[i * (len(by_length) - 1) // (count - 1)] for i in range(count)]
    return [Prompt(id=f"p{i}", text=chat_prompt(tokenizer, text)) for i, text in enumerate(texts)]


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


def test_token_from_uniform_is_the_first_token_whose_cumulative_probability_exceeds_u():
    # cumulative sums 0.125, 0.375, 0.5, 1.0: token i owns u in [c(i-1), c(i))
    probs = torch.tensor([[0.125, 0.25, 0.125, 0.5]])
    expected = {0.01: 0, 0.124: 0, 0.125: 1, 0.3: 1, 0.375: 2, 0.49: 2, 0.5: 3, 0.75: 3, 1 - 2**-53: 3}
    for u, token in expected.items():
        assert token_from_uniform(probs, torch.tensor([u], dtype=torch.float64)).tolist() == [token], u
    # a token of probability 0 owns no u: at its boundary the next token with mass is drawn
    holed = torch.tensor([[0.25, 0.0, 0.25, 0.5]]).expand(3, 4)
    uniforms = torch.tensor([0.2, 0.25, 0.3], dtype=torch.float64)
    assert token_from_uniform(holed, uniforms).tolist() == [0, 2, 2]
    # unnormalised weights draw as their normalised probabilities (the threshold is u * total)
    assert token_from_uniform(probs * 8, torch.tensor([0.3], dtype=torch.float64)).tolist() == [1]
    # through sample_next_token: a [1, 4] logit row of known probabilities, away from the boundaries
    logits = probs.log()
    for u, token in {0.1: 0, 0.2: 1, 0.45: 2, 0.6: 3}.items():
        assert sample_next_token(logits, SamplingParams(1), torch.tensor([u], dtype=torch.float64)).tolist() == [token]
    # greedy ignores u
    assert sample_next_token(logits, SamplingParams(1, temperature=0), torch.tensor([0.01])).tolist() == [3]


@pytest.mark.parametrize("length", [5, SCAN_BLOCK, SCAN_BLOCK + 1, 3 * SCAN_BLOCK - 7])
def test_a_rows_cumulative_sum_in_blocks_is_the_whole_rows(length):
    # exact for integers, within rounding for floats; every block boundary and a short last block included
    counts = torch.randint(0, 3, (3, length), dtype=torch.int32, generator=torch.Generator().manual_seed(length))
    assert torch.equal(row_cumsum(counts), counts.cumsum(-1))
    probs = torch.rand(3, length, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(row_cumsum(probs), probs.cumsum(-1), rtol=1e-14, atol=0)
    # a hand example across a boundary: blocks of ones count 1, 2, ... on past the block's end
    ones = torch.ones(1, SCAN_BLOCK + 2)
    assert row_cumsum(ones)[0, SCAN_BLOCK - 1 :].tolist() == [SCAN_BLOCK, SCAN_BLOCK + 1, SCAN_BLOCK + 2]


def test_splitmix64_gives_the_reference_outputs_and_its_vectorised_form_agrees():
    # the published outputs of SplitMix64 seeded with 1234567 (splitmix64.c; Rosetta Code)
    reference = [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431]
    assert [splitmix64(1234567, t) for t in range(4)] == reference
    seeds = [0, 1, 2, 1234567, 2**62 + 12345, 2**63 - 2, 2**63 - 1]  # the sign bit set along the way
    stream = splitmix64_stream(torch.tensor(seeds), 9)
    assert stream.dtype == torch.int64 and stream.shape == (len(seeds), 9)
    assert [[int(x) % 2**64 for x in row] for row in stream] == [[splitmix64(s, t) for t in range(9)] for s in seeds]


def test_position_uniforms_are_deterministic_inside_0_1_and_uniform():
    seeds = torch.tensor([row_seed(7, i) for i in range(100)])
    u = position_uniforms(seeds, 100)  # [100, 100]: 10k numbers
    assert u.dtype == torch.float64 and u.shape == (100, 100)
    assert torch.equal(u, position_uniforms(seeds, 100))
    assert torch.equal(u[:, :40], position_uniforms(seeds, 40))  # position t's number is the same for any length
    assert u.gt(0).all() and u.lt(1).all()
    assert abs(u.mean().item() - 0.5) < 0.01  # standard error 0.003
    assert abs(u.var().item() - 1 / 12) < 0.004  # standard error 0.0007
    counts = torch.histc(u, bins=10, min=0, max=1)
    assert counts.min() > 880 and counts.max() < 1120  # 1000 +- 4 standard errors
    assert position_uniforms(torch.tensor([0, 2**63 - 1]), 3).gt(0).all()  # extreme seeds too


def _draw_frequencies(probs: torch.Tensor, params: SamplingParams, rows: int = 20_000) -> torch.Tensor:
    """Sample the same distribution in `rows` rows with distinct seeds; the frequency of each token."""
    logits = probs.log().expand(rows, len(probs))
    uniforms = position_uniforms(torch.tensor([row_seed(11, i) for i in range(rows)]), 1)[:, 0]
    return torch.bincount(sample_next_token(logits, params, uniforms), minlength=len(probs)) / rows


def _chi_square(frequencies: torch.Tensor, expected: torch.Tensor, rows: int = 20_000) -> float:
    kept = expected > 0
    return float(rows * ((frequencies[kept] - expected[kept]) ** 2 / expected[kept]).sum())


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(1), [0.4, 0.3, 0.2, 0.1]),
        (SamplingParams(1, temperature=2.0), (torch.tensor([0.4, 0.3, 0.2, 0.1]).sqrt() / 1.7124).tolist()),
        (SamplingParams(1, top_k=2), [4 / 7, 3 / 7, 0.0, 0.0]),
        (SamplingParams(1, top_p=0.8), [4 / 9, 3 / 9, 2 / 9, 0.0]),
        (SamplingParams(1, top_k=3, top_p=0.5), [4 / 7, 3 / 7, 0.0, 0.0]),
        (SamplingParams(1, top_k=1), [1.0, 0.0, 0.0, 0.0]),
    ],
    ids=["plain", "temperature-2", "top-k-2", "top-p-0.8", "top-k-3-top-p-0.5", "top-k-1"],
)
def test_sampling_follows_the_tempered_and_filtered_distribution(params, expected):
    expected = torch.tensor(expected)
    expected = expected / expected.sum()
    frequencies = _draw_frequencies(torch.tensor([0.4, 0.3, 0.2, 0.1]), params)
    assert frequencies[expected == 0].eq(0).all()  # a filtered token is never drawn
    assert torch.allclose(frequencies, expected, atol=0.012)
    # at most 3 degrees of freedom: 16.3 is the 0.1% tail, far above what these fixed seeds give
    assert _chi_square(frequencies, expected) < 16.3


@pytest.mark.parametrize(
    ("k", "p"), [(1, 1.0), (3, 1.0), (5, 1.0), (3, 0.61), (5, 0.47), (8, 0.93), (12, 0.29), (40, 0.987)]
)
def test_top_k_weights_keep_the_distribution_of_the_filters_ties_included(k, p):
    """Integer logits tie often, at the k-th and at the top-p boundary: top_k_weights keeps as many tokens of each
    logit as the filters do (which of the tied ones is a free choice), with the filters' probabilities. (p is
    no sum of these probabilities: where it is one, float rounding decides the boundary token, either way.)"""
    g = torch.Generator().manual_seed(k)
    logits = torch.randint(-3, 4, (64, 40), generator=g).float()
    weights, most_likely = top_k_weights(logits, k, p)
    filtered = top_p_filter(top_k_filter(logits, k), p)
    assert torch.equal(logits.gather(-1, most_likely[:, None]).squeeze(-1), logits.amax(-1))
    for row in range(len(logits)):
        kept = weights[row] > 0
        assert logits[row, kept].sort().values.tolist() == logits[row, filtered[row].isfinite()].sort().values.tolist()
        ours = (weights[row, kept] / weights[row].sum()).sort().values
        theirs = filtered[row].softmax(-1)[filtered[row].isfinite()].sort().values
        torch.testing.assert_close(ours, theirs)


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
        seeds=list(range(len(ids))),
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
    seeds = [0] * len(ids)
    free = generate(model, ids, greedy, eos_token_id=pad, pad_token_id=pad, seeds=seeds)
    stop = free.response_ids[0][2]  # make the third greedy token of row 0 an end token
    stopped = generate(model, ids, greedy, eos_token_id=[pad, stop], pad_token_id=pad, seeds=seeds)
    for full, cut, ended in zip(free.response_ids, stopped.response_ids, stopped.is_end):
        ends = [i for i, t in enumerate(full) if t in (pad, stop)]
        assert cut == (full[: ends[0] + 1] if ends else full)
        assert ended == bool(ends)
        assert len(cut) == 8 or ended
    assert stopped.is_end[0] and len(stopped.response_ids[0]) <= 3
    assert not all(stopped.is_end)  # some row ran to max_new_tokens and reports no end


def test_same_seeds_give_same_samples(tokenizer):
    model = tiny_model("qwen2", tokenizer)
    ids = prompt_ids(tokenizer)
    params = SamplingParams(10, temperature=1.0, top_p=0.95, top_k=50)

    def sample(seeds: list[int]) -> Generation:
        return generate(model, ids, params, eos_token_id=tokenizer.eos_token_id, pad_token_id=0, seeds=seeds)

    torch.manual_seed(0)
    first = sample([3, 4, 5, 6, 7])
    torch.manual_seed(1)  # the global RNG plays no part
    assert sample([3, 4, 5, 6, 7]) == first
    other = sample([8, 4, 5, 6, 7]).response_ids  # a row's seed changes that row only
    assert other[0] != first.response_ids[0] and other[1:] == first.response_ids[1:]


def test_a_rows_sample_does_not_depend_on_the_rows_beside_it(tiny_tokenizer, tiny_qwen2):
    """Rows a, b, c together, b alone, c and a reversed, batch sizes 1 and 3: each row's response is its own."""
    ids = tokenize_prompts(tiny_prompts(tiny_tokenizer, 3), tiny_tokenizer)
    ids = [ids[1], ids[2], ids[0]]  # a in the middle, b the longest, c the shortest
    assert len({len(p) for p in ids}) == 3  # three lengths: the rows are padded differently in each batch
    seeds = [row_seed(5, i) for i in range(3)]
    params = SamplingParams(16, temperature=1.0, top_p=0.95, top_k=50)

    def sample(rows: list[int], batch_size: int) -> dict[int, tuple[list[int], bool, list[float]]]:
        generation = generate(
            tiny_qwen2,
            [ids[i] for i in rows],
            params,
            eos_token_id=tiny_tokenizer.eos_token_id,
            pad_token_id=tiny_tokenizer.pad_token_id,
            seeds=[seeds[i] for i in rows],
            batch_size=batch_size,
        )
        return {i: row for i, row in zip(rows, zip(generation.response_ids, generation.is_end, generation.logprobs))}

    together = sample([0, 1, 2], batch_size=3)
    assert len({tuple(response) for response, _, _ in together.values()}) == 3
    for rows, batch_size in (([1], 3), ([2, 0], 3), ([0, 1, 2], 1), ([2, 1, 0], 2)):
        for i, (response, ended, logprobs) in sample(rows, batch_size).items():
            assert (response, ended) == together[i][:2], (rows, batch_size, i)
            assert logprobs == pytest.approx(together[i][2], abs=1e-5)


def _sample_tiny(model, tokenizer, params, decode=DecodeOptions(), eos=None, batch_size=3) -> Generation:
    ids = tokenize_prompts(tiny_prompts(tokenizer, 5), tokenizer)
    return generate(
        model,
        ids,
        params,
        eos_token_id=tokenizer.eos_token_id if eos is None else eos,
        pad_token_id=tokenizer.pad_token_id,
        seeds=[row_seed(3, i) for i in range(len(ids))],
        batch_size=batch_size,
        decode=decode,
    )


def _assert_same_generation(ours: Generation, theirs: Generation) -> None:
    assert ours.response_ids == theirs.response_ids and ours.is_end == theirs.is_end
    for a, b in zip(ours.logprobs, theirs.logprobs):
        assert a == pytest.approx(b, abs=1e-5)


def _common_tokens(tokenizer, model, count: int, params: SamplingParams = SamplingParams(16)) -> list[int]:
    """The tokens the model samples most with these settings: as end tokens, they end rows at different steps."""
    drawn = _sample_tiny(model, tokenizer, params).response_ids
    return torch.bincount(torch.tensor([t for row in drawn for t in row])).argsort(descending=True)[:count].tolist()


@pytest.mark.parametrize("interval", [2, 5, 64])
def test_looking_for_the_end_every_few_steps_changes_nothing(tiny_tokenizer, tiny_qwen2, interval):
    """Rows that end early get padding until the batch stops: a later look at whether all ended only costs steps."""
    params = SamplingParams(16, top_k=20, top_p=0.9)
    eos = _common_tokens(tiny_tokenizer, tiny_qwen2, 3, params)
    every_step = _sample_tiny(tiny_qwen2, tiny_tokenizer, params, DecodeOptions(end_check_interval=1), eos)
    assert any(every_step.is_end) and not all(len(r) == 16 for r in every_step.response_ids)
    later = _sample_tiny(tiny_qwen2, tiny_tokenizer, params, DecodeOptions(end_check_interval=interval), eos)
    _assert_same_generation(later, every_step)


@pytest.mark.parametrize(("interval", "forwards"), [(1, 1), (3, 3), (8, 8)])
def test_a_batch_whose_rows_all_ended_stops(tiny_tokenizer, tiny_qwen2, interval, forwards):
    """Every token ends a response: each row ends at its first token, and the batch stops at the first look."""
    calls = []
    hook = tiny_qwen2.register_forward_hook(lambda *_: calls.append(1))
    try:
        every_token = list(range(tiny_qwen2.config.vocab_size))
        options = DecodeOptions(end_check_interval=interval)
        generation = _sample_tiny(tiny_qwen2, tiny_tokenizer, SamplingParams(20), options, every_token, batch_size=8)
    finally:
        hook.remove()
    assert all(generation.is_end) and all(len(r) == 1 for r in generation.response_ids)
    assert len(calls) == forwards  # the prefill, then a step per response position before the look


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "mistral"])
def test_the_static_cache_gives_the_tokens_of_the_dynamic_one(tokenizer, family):
    model = tiny_model(family, tokenizer)
    ids = prompt_ids(tokenizer)
    for params in (SamplingParams(12, temperature=0), SamplingParams(12, temperature=0.8, top_k=30, top_p=0.9)):

        def sample(decode: DecodeOptions, params=params) -> Generation:
            eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
            seeds = list(range(len(ids)))
            return generate(
                model, ids, params, eos_token_id=eos, pad_token_id=pad, seeds=seeds, batch_size=2, decode=decode
            )

        _assert_same_generation(sample(DecodeOptions(static_cache=True)), sample(DecodeOptions()))


@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral-sliding"])
def test_a_prompt_sampled_n_times_is_prefilled_once_and_each_row_samples_as_if_prefilled_alone(tokenizer, family):
    """A group's rows share their prompt: the prefill runs on the batch's distinct prompts only (interleaved copies
    here, and a sliding-window cache shorter than the prompts), and every row samples the tokens it samples when
    each copy is prefilled. A static cache, whose buffers are sized for the batch, prefills every copy."""
    if family == "mistral-sliding":
        model = MistralForCausalLM(MistralConfig(vocab_size=len(tokenizer), sliding_window=4, **decoder_shape()))
    else:
        model = tiny_model(family, tokenizer)
    distinct = prompt_ids(tokenizer)
    ids = [distinct[i] for i in (0, 2, 0, 3, 2, 0, 3, 2)]  # three prompts, copies apart and of different lengths
    prefill_rows = []  # the rows of each forward that reads more than one token

    def count_prefill(_, args, kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            prefill_rows.append(kwargs["input_ids"].shape[0])

    hook = model.register_forward_pre_hook(count_prefill, with_kwargs=True)
    params = SamplingParams(12, temperature=0.9, top_k=40)

    def sample(decode: DecodeOptions) -> Generation:
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        seeds = [row_seed(7, i) for i in range(len(ids))]
        return generate(
            model, ids, params, eos_token_id=eos, pad_token_id=pad, seeds=seeds, batch_size=8, decode=decode
        )

    try:
        shared = sample(DecodeOptions())
        assert prefill_rows == [3]  # one prefill, of the three distinct prompts
        each = sample(DecodeOptions(share_prefill=False))
        assert prefill_rows[1:] == [8]
        prefill_rows.clear()
        static = sample(DecodeOptions(static_cache=True))
        assert prefill_rows == [8]
    finally:
        hook.remove()
    _assert_same_generation(shared, each)
    _assert_same_generation(static, each)
    assert len({tuple(r) for r in shared.response_ids}) > 3  # the copies of a prompt drew different answers


def test_the_cache_preallocates_plain_layers_and_keeps_sliding_ones(tokenizer):
    """The default cache writes a step's keys and values in place; a sliding-window layer keeps transformers' own."""
    llama = preallocated_cache(tiny_model("llama", tokenizer).config, 40)
    assert all(type(layer) is PreallocatedLayer for layer in llama.layers)
    keys, values = llama.update(torch.ones(2, 2, 30, 16), torch.ones(2, 2, 30, 16), 0)
    step_keys, _ = llama.update(torch.full((2, 2, 1, 16), 2.0), torch.full((2, 2, 1, 16), 2.0), 0)
    assert step_keys.shape == (2, 2, 31, 16) and step_keys.data_ptr() == keys.data_ptr()  # same buffer, no copy
    assert step_keys[:, :, -1].eq(2).all() and step_keys[:, :, :30].eq(1).all() and llama.get_seq_length() == 31
    llama.layers[0].batch_select_indices(torch.tensor([1, 1, 0]))  # rows kept (a repeat too): still one buffer
    llama.layers[0].batch_repeat_interleave(2)
    kept, _ = llama.update(torch.full((6, 2, 1, 16), 3.0), torch.full((6, 2, 1, 16), 3.0), 0)
    assert kept.shape == (6, 2, 32, 16) and kept.data_ptr() == llama.layers[0]._key_buffer.data_ptr()
    assert kept[:, :, 30].eq(2).all() and kept[:, :, 31].eq(3).all()
    mistral = MistralForCausalLM(MistralConfig(vocab_size=len(tokenizer), sliding_window=8, **decoder_shape()))
    assert not any(isinstance(layer, PreallocatedLayer) for layer in preallocated_cache(mistral.config, 40).layers)


@pytest.mark.filterwarnings("error::UserWarning:torch._dynamo")  # e.g. a cached helper called inside the graph
def test_the_compiled_decode_step_gives_the_tokens_of_the_eager_one(tiny_tokenizer, tiny_qwen2):
    """torch.compile traces decode_step over the static cache, with no warning from dynamo. aot_eager runs the
    traced graph without inductor, whose C++ build takes a minute or more per shape on a CPU (it gave the same
    tokens when tried)."""
    compiled = DecodeOptions(compile=True, compile_backend="aot_eager")
    for params in (SamplingParams(10, temperature=0), SamplingParams(10, top_k=20, top_p=0.9)):
        eager = _sample_tiny(tiny_qwen2, tiny_tokenizer, params, batch_size=5)
        _assert_same_generation(_sample_tiny(tiny_qwen2, tiny_tokenizer, params, compiled, batch_size=5), eager)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (DecodeOptions(compile=True, static_cache=False), "a compiled decode step needs the static cache"),
        (DecodeOptions(end_check_interval=0), "end_check_interval must be at least 1, got 0"),
    ],
)
def test_unusable_decode_options_are_clear_errors(tokenizer, options, message):
    with pytest.raises(ValueError, match=message):
        generate(
            tiny_model("llama", tokenizer), [[5]], SamplingParams(2), eos_token_id=1, pad_token_id=0, seeds=[0],
            decode=options,
        )  # fmt: skip


def test_generate_restores_training_mode(tokenizer):
    model = tiny_model("gpt2", tokenizer)
    model.train()
    ids = prompt_ids(tokenizer)[:2]
    generate(model, ids, SamplingParams(2), eos_token_id=1, pad_token_id=0, seeds=[0, 1])
    assert model.training


@pytest.mark.parametrize(
    ("prompts", "eos", "batch_size", "seeds", "message"),
    [
        ([[5] * 120], 1, 8, [0], "a prompt of 120 tokens plus max_new_tokens=9 exceeds the model's context of 128"),
        ([[5], []], 1, 8, [0, 1], "every prompt needs at least one token"),
        ([[5]], [], 8, [0], "eos_token_id is an empty list"),
        ([[5]], 1, 0, [0], "batch_size must be at least 1"),
        ([[5], [6]], 1, 8, [0], r"1 seeds for 2 prompts: give one seed per prompt"),
        ([[5]], 1, 8, [-1], r"every seed must be an int in \[0, 2\*\*63\), got -1"),
        ([[5]], 1, 8, [2**63], r"every seed must be an int in \[0, 2\*\*63\), got 9223372036854775808"),
        ([[5]], 1, 8, [1.5], r"every seed must be an int in \[0, 2\*\*63\), got 1.5"),
    ],
)
def test_unusable_generate_arguments_are_clear_errors(tokenizer, prompts, eos, batch_size, seeds, message):
    model = tiny_model("llama", tokenizer)
    with pytest.raises(ValueError, match=message):
        generate(
            model, prompts, SamplingParams(9), eos_token_id=eos, pad_token_id=0, seeds=seeds, batch_size=batch_size
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
    # tempered and filtered sampling: the logprobs are those of the distribution drawn from, as training scores them
    params = SamplingParams(10, temperature=0.7, top_k=40, top_p=0.9)
    generation = generate(
        model,
        ids,
        params,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        seeds=list(range(len(ids))),
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
    sampled = SampledDistribution.of(params)
    recomputed = batched_token_logprobs(model, batch, micro_batch_size=2, distribution=sampled)
    assert torch.allclose(recomputed * mask, batch.gen_logprobs, atol=1e-4)
    assert batch.gen_logprobs[mask == 1].le(0).all()
    raw = batched_token_logprobs(model, batch, micro_batch_size=2)  # what training scored before: not the sampler's
    assert (raw - batch.gen_logprobs)[mask == 1].abs().max() > 0.05


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
        self.calls: list[tuple[list[list[int]], SamplingParams, list[int]]] = []

    def generate(self, model, prompt_token_ids, params, seeds):
        self.calls.append((prompt_token_ids, params, seeds))
        rows = len(prompt_token_ids)
        return Generation(response_ids=[[7, self.eos]] * rows, is_end=[True] * rows, logprobs=[[-0.5, -0.25]] * rows)


ROLLOUT = RolloutConfig(
    generation_batch_size=2, sampling=SamplingConfig(max_new_tokens=6, temperature=0.8, top_p=0.9, top_k=5)
)


def test_sampler_asks_its_backend_for_n_adjacent_rows_per_prompt_each_with_its_row_seed(tokenizer):
    backend = RecordingBackend(tokenizer.eos_token_id)
    sampler = Sampler(tokenizer, ROLLOUT, backend=backend)
    prompts = [Prompt(id="a", text="the cat"), Prompt(id="b", text="two")]
    batch = sampler.rollouts(None, prompts, 3, seed=(5, 2))
    token_ids, params, seeds = backend.calls[-1]
    assert token_ids == [ids for ids in tokenize_prompts(prompts, tokenizer) for _ in range(3)]
    assert params == SamplingParams(6, temperature=0.8, top_p=0.9, top_k=5)
    assert seeds == [row_seed(step_seed(5, 2), i) for i in range(6)]
    assert batch.prompt_ids == ["a", "a", "a", "b", "b", "b"] and batch.is_end.all()

    sampler.rollouts(None, prompts, 3, seed=(5, 2), prompt_positions=[4, 1])  # a process's share of a step
    assert backend.calls[-1][2] == [row_seed(step_seed(5, 2), i) for i in (12, 13, 14, 3, 4, 5)]

    sampler.validation_rollouts(None, prompts, 1, max_new_tokens=None, seed=5)
    assert backend.calls[-1][1:] == (
        SamplingParams(6, temperature=0.0, top_p=0.9, top_k=5),
        [row_seed(step_seed(5, -1), i) for i in range(2)],
    )
    sampler.validation_rollouts(None, prompts, 2, max_new_tokens=3, seed=5, prompt_positions=[1, 0])
    assert backend.calls[-1][1] == SamplingParams(3, temperature=0.8, top_p=0.9, top_k=5)
    assert backend.calls[-1][2] == [row_seed(step_seed(5, -1), i) for i in (2, 3, 0, 1)]


def test_row_seeds_are_distinct_int63_and_laid_out_by_global_row():
    seeds = rollout_seeds(step_seed(1, 0), range(64), 16)  # 1024 rows
    assert len(set(seeds)) == 1024 and all(0 <= s < 2**63 for s in seeds)
    assert rollout_seeds(step_seed(1, 0), [3, 0], 16) == seeds[48:64] + seeds[:16]
    assert set(seeds).isdisjoint(rollout_seeds(step_seed(1, 1), range(64), 16))  # the next step: other seeds


@pytest.mark.parametrize(
    ("positions", "message"),
    [
        ([0], "1 prompt positions for 2 prompts: give one position per prompt"),
        ([0, -2], "prompt positions index the step's whole prompt list and are >= 0; got -2"),
        ([3, 3], "prompt position 3 appears twice; each prompt's rows need their own seeds"),
    ],
)
def test_unusable_prompt_positions_are_clear_errors(tokenizer, positions, message):
    sampler = Sampler(tokenizer, ROLLOUT, backend=RecordingBackend(tokenizer.eos_token_id))
    prompts = [Prompt(id="a", text="the cat"), Prompt(id="b", text="two")]
    with pytest.raises(ValueError, match=re.escape(message)):
        sampler.rollouts(None, prompts, 2, seed=(0, 0), prompt_positions=positions)
    with pytest.raises(ValueError, match=re.escape(message)):
        sampler.validation_rollouts(None, prompts, 2, max_new_tokens=None, seed=0, prompt_positions=positions)


def test_sampler_defaults_to_the_builtin_sampler_seeded_per_step(tokenizer):
    model = tiny_model("llama", tokenizer)
    prompts = [Prompt(id=str(i), text=t) for i, t in enumerate(PROMPTS[:3])]
    batch = Sampler(tokenizer, ROLLOUT).rollouts(model, prompts, 2, seed=(0, 4))
    token_ids = [ids for ids in prompt_ids(tokenizer, PROMPTS[:3]) for _ in range(2)]
    expected = generate(
        model,
        token_ids,
        SamplingParams(6, temperature=0.8, top_p=0.9, top_k=5),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        seeds=rollout_seeds(step_seed(0, 4), range(3), 2),
        batch_size=2,
    )
    assert batch.response_lengths.tolist() == [len(r) for r in expected.response_ids]
    assert batch.is_end.tolist() == expected.is_end
    for row, (p, r) in enumerate(zip(token_ids, expected.response_ids)):
        assert batch.tokens[row, : len(p) + len(r)].tolist() == p + r


def _rows(batch) -> list[tuple]:
    """Each rollout row without its padding: prompt id, tokens, end, text and the sampler's log-probs."""
    rows = []
    for i in range(len(batch.prompt_ids)):
        length = int(batch.prompt_lengths[i] + batch.response_lengths[i])
        rows.append(
            (
                batch.prompt_ids[i],
                batch.tokens[i, :length].tolist(),
                bool(batch.is_end[i]),
                batch.response_texts[i],
                batch.gen_logprobs[i, : length - 1],
            )
        )
    return rows


def _assert_same_rows(ours: list[tuple], theirs: list[tuple]) -> None:
    assert len(ours) == len(theirs)
    for row, other in zip(ours, theirs):
        assert row[:4] == other[:4]
        torch.testing.assert_close(row[4], other[4], rtol=0, atol=1e-5)


def test_two_data_parallel_shares_draw_exactly_the_rows_of_the_whole_step(tiny_tokenizer, tiny_qwen2):
    """Process 0 samples prompts 0 and 2, process 1 prompts 1 and 3: together, the rows of one process doing all."""
    sampler = Sampler(tiny_tokenizer, ROLLOUT)
    prompts = tiny_prompts(tiny_tokenizer, 4)
    whole = _rows(sampler.rollouts(tiny_qwen2, prompts, 3, seed=(9, 2)))
    share_0 = _rows(sampler.rollouts(tiny_qwen2, prompts[0::2], 3, seed=(9, 2), prompt_positions=[0, 2]))
    share_1 = _rows(sampler.rollouts(tiny_qwen2, prompts[1::2], 3, seed=(9, 2), prompt_positions=[1, 3]))
    by_prompt = [share_0[:3], share_1[:3], share_0[3:], share_1[3:]]
    _assert_same_rows(whole, [row for rows in by_prompt for row in rows])
    assert len({tuple(row[1]) for row in whole}) > 4  # the rows of one prompt differ: each has its own seed

    validation = _rows(sampler.validation_rollouts(tiny_qwen2, prompts, 2, max_new_tokens=5, seed=9))
    shares = [
        _rows(sampler.validation_rollouts(tiny_qwen2, prompts[r::2], 2, 5, seed=9, prompt_positions=[r, r + 2]))
        for r in (0, 1)
    ]
    _assert_same_rows(validation, shares[0][:2] + shares[1][:2] + shares[0][2:] + shares[1][2:])


def test_a_resumed_run_draws_the_same_rollouts_again(tiny_tokenizer, tiny_qwen2):
    """A fresh Sampler, other global RNG state: the same (run seed, step) draws the same rows; the next step others."""
    prompts = tiny_prompts(tiny_tokenizer, 4)
    torch.manual_seed(0)
    first = _rows(Sampler(tiny_tokenizer, ROLLOUT).rollouts(tiny_qwen2, prompts, 2, seed=(4, 7)))
    torch.manual_seed(1)
    sampler = Sampler(tiny_tokenizer, ROLLOUT)
    _assert_same_rows(_rows(sampler.rollouts(tiny_qwen2, prompts, 2, seed=(4, 7))), first)
    next_step = _rows(sampler.rollouts(tiny_qwen2, prompts, 2, seed=(4, 8)))
    assert [row[1] for row in next_step] != [row[1] for row in first]
