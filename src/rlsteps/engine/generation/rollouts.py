"""Rollouts: N samples per prompt for training, greedy (or a few samples) for validation.

The Sampler is what the loop asks for rollouts: it tokenises the prompts, leaves the sampling to a
GenerationBackend (the built-in sampler unless another is given) and lays the result out as a RolloutBatch.

Every rollout row has its own seed, from the step's seed and the row's index in the step's whole
prompt list: the row's sample is the same whichever process generates it and with whichever rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlsteps.contract.config import RolloutConfig
from rlsteps.contract.prompts import Prompt, encode_prompt_text
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.generation.backend import Generation, GenerationBackend, SamplingParams
from rlsteps.engine.generation.builtin import BuiltinBackend
from rlsteps.engine.generation.sizing import CPU_BATCH
from rlsteps.engine.generation.uniforms import splitmix64


def step_seed(seed: int, step: int) -> int:
    """A sampling seed per (run seed, step): resumed runs draw exactly the samples they would have."""
    return (seed * 1_000_003 + step * 7_919 + 17) % (2**63 - 1)


def row_seed(seed: int, index: int) -> int:
    """The seed of rollout row `index` of a step whose seed is `seed`: an int in [0, 2**63).

    Output `index` of SplitMix64 seeded with the step's seed, its top 63 bits: well mixed, so
    neighbouring rows and neighbouring steps get unrelated seeds.
    """
    return splitmix64(seed, index) >> 1


def rollout_seeds(seed: int, prompt_positions: Sequence[int], n: int) -> list[int]:
    """Row seeds of n adjacent rows per prompt: row k of the prompt at position j is global row j * n + k."""
    return [row_seed(seed, j * n + k) for j in prompt_positions for k in range(n)]


class Sampler:
    """Rollout batches for the loop; a GenerationBackend samples the responses."""

    def __init__(self, tokenizer, rollout: RolloutConfig, backend: GenerationBackend | None = None) -> None:
        self.tokenizer = tokenizer
        self.rollout = rollout
        self.backend = backend or BuiltinBackend(tokenizer, rollout.generation_batch_size or CPU_BATCH)

    @property
    def samples_from_policy(self) -> bool:
        """Whether rollouts read the policy's own weights (then a sharded policy is gathered for them)."""
        return self.backend.samples_from_policy

    def load_weights(self, model) -> None:
        """After an update: the backend samples from the policy's new weights from now on."""
        self.backend.load_weights(model)

    def release(self) -> None:
        """The step's rollouts are done: the backend may give its memory to training until the next update."""
        self.backend.release()

    def step_figures(self) -> dict[str, float]:
        """Figures of the last step's rollouts that only the sampler knows (none here; see generation.beside)."""
        return {}

    def checkpoint_state(self, next_step: int) -> dict[str, Any]:
        """What a checkpoint taken before step `next_step` must keep of the sampler to resume exactly (nothing: rows
        are drawn from their seeds and the policy's weights alone; see generation.beside)."""
        return {}

    def rollouts(
        self,
        model,
        prompts: list[Prompt],
        n: int,
        seed: tuple[int, int],
        prompt_positions: Sequence[int] | None = None,
    ) -> RolloutBatch:
        """n sampled rows per prompt for the step seeded by seed = (run seed, step).

        prompt_positions are these prompts' positions in the step's whole prompt list (by default
        0, 1, ...): a data-parallel process passes those of its share and draws exactly the rows
        that one process generating the whole list would.
        """
        return self._sample(model, prompts, n, self.sampling_params(), step_seed(*seed), prompt_positions)

    def sampling_params(self) -> SamplingParams:
        """The training rollouts' sampling settings (rollout.sampling)."""
        s = self.rollout.sampling
        return SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)

    def validation_rollouts(
        self,
        model,
        prompts: list[Prompt],
        n: int,
        max_new_tokens: int | None,
        seed: int,
        prompt_positions: Sequence[int] | None = None,
        on_answered: Callable[[int], None] | None = None,
    ) -> RolloutBatch:
        """One greedy response per prompt, or n sampled ones where the scorer compares responses.

        prompt_positions as in rollouts, in the whole validation prompt list. on_answered: called with the count of
        rows answered so far, as often as the backend can tell (the built-in sampler: as rows end).
        """
        s = self.rollout.sampling
        params = SamplingParams(
            max_new_tokens=max_new_tokens or s.max_new_tokens,
            temperature=0.0 if n == 1 else s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
        )
        return self._sample(model, prompts, n, params, step_seed(seed, -1), prompt_positions, on_answered)

    def _sample(
        self,
        model,
        prompts: list[Prompt],
        n: int,
        params: SamplingParams,
        seed: int,
        prompt_positions: Sequence[int] | None,
        on_answered: Callable[[int], None] | None = None,
    ) -> RolloutBatch:
        positions = range(len(prompts)) if prompt_positions is None else prompt_positions
        check_prompt_positions(positions, len(prompts))
        repeated, token_ids = rollout_rows(prompts, self.tokenizer, n)
        counting = {"on_answered": on_answered} if on_answered is not None else {}
        generation = self.backend.generate(model, token_ids, params, rollout_seeds(seed, positions, n), **counting)
        return build_rollout_batch(repeated, token_ids, generation, self.tokenizer)


def check_prompt_positions(positions: Sequence[int], count: int) -> None:
    """Raise a ValueError unless there is one distinct, non-negative position per prompt."""
    if len(positions) != count:
        raise ValueError(f"{len(positions)} prompt positions for {count} prompts: give one position per prompt")
    negative = [j for j in positions if j < 0]
    if negative:
        raise ValueError(f"prompt positions index the step's whole prompt list and are >= 0; got {negative[0]}")
    if len(set(positions)) != count:
        repeated = next(j for j in positions if list(positions).count(j) > 1)
        raise ValueError(f"prompt position {repeated} appears twice; each prompt's rows need their own seeds")


def rollout_rows(prompts: list[Prompt], tokenizer: Any, n: int) -> tuple[list[Prompt], list[list[int]]]:
    """n adjacent rows per prompt (groups are by id): the prompts repeated, and their token ids."""
    token_ids = [ids for ids in tokenize_prompts(prompts, tokenizer) for _ in range(n)]
    return [p for p in prompts for _ in range(n)], token_ids


def tokenize_prompts(prompts: list[Prompt], tokenizer: Any) -> list[list[int]]:
    """Token ids of each rendered prompt; the BOS rule is in rlsteps.contract.prompts.encode_prompt_text."""
    return [encode_prompt_text(prompt.text, tokenizer) for prompt in prompts]


def build_rollout_batch(
    prompts: list[Prompt], prompt_token_ids: list[list[int]], generation: Generation, tokenizer: Any
) -> RolloutBatch:
    """Right-padded prompt+response rows with the sampler's log-probs on the response positions."""
    if not len(prompts) == len(prompt_token_ids) == len(generation.response_ids):
        raise ValueError(
            f"{len(prompts)} prompts, {len(prompt_token_ids)} tokenised prompts and "
            f"{len(generation.response_ids)} responses: one of each per rollout is needed"
        )
    if any(len(ids) == 0 for ids in prompt_token_ids):
        raise ValueError("every prompt needs at least one token; an empty prompt has no position to score from")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (load_policy uses EOS)")
    pad_id = tokenizer.pad_token_id
    prompt_lengths = torch.tensor([len(ids) for ids in prompt_token_ids])
    response_lengths = torch.tensor([len(ids) for ids in generation.response_ids])
    width = int((prompt_lengths + response_lengths).max())
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    gen_logprobs = torch.zeros(len(prompts), width - 1)  # entry t scores token t+1
    for i, (prompt_ids, response_ids) in enumerate(zip(prompt_token_ids, generation.response_ids)):
        p, r = len(prompt_ids), len(response_ids)
        tokens[i, : p + r] = torch.tensor(prompt_ids + response_ids)
        gen_logprobs[i, p - 1 : p + r - 1] = torch.tensor(generation.logprobs[i], dtype=torch.float32)
    return RolloutBatch(
        tokens=tokens,
        prompt_lengths=prompt_lengths,
        response_lengths=response_lengths,
        is_end=torch.tensor(generation.is_end, dtype=torch.bool),
        prompt_ids=[prompt.id for prompt in prompts],
        prompt_texts=[prompt.text for prompt in prompts],
        response_texts=tokenizer.batch_decode(generation.response_ids, skip_special_tokens=True),
        pad_id=pad_id,
        gen_logprobs=gen_logprobs,
        conversations=[prompt.conversation for prompt in prompts],
        fields=[prompt.fields for prompt in prompts],
    )
