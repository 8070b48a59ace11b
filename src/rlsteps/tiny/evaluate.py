"""How good a tiny world is: the SFT policy's EOS rate, true reward and repetition, the reward model's accuracy."""

from __future__ import annotations

import random

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from rlsteps.tiny import task as tiny_task
from rlsteps.tiny.recipe import EVAL, RM
from rlsteps.tiny.tokenizer import chat_prompt
from rlsteps.tiny.training import reward_scores


@torch.no_grad()
def sample_responses(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    prompts: list[str],
    max_new_tokens: int = 32,
    greedy: bool = False,
) -> list[tuple[str, bool]]:
    """(decoded response, ended with EOS) for each rendered prompt, sampled at temperature 1 (or greedy)."""
    encoded = tokenizer(prompts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
    sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    output = policy.generate(
        **encoded,
        **sampling,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    results = []
    for row in output[:, encoded["input_ids"].shape[1] :].tolist():
        ended = tokenizer.eos_token_id in row
        response = row[: row.index(tokenizer.eos_token_id)] if ended else row
        results.append((tokenizer.decode(response, skip_special_tokens=True), ended))
    return results


@torch.no_grad()
def pair_accuracy(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[str, str, str]]
) -> float:
    prompts, chosen, rejected = zip(*pairs)
    rendered = [chat_prompt(tokenizer, p) for p in prompts]
    chosen_scores = reward_scores(reward_model, tokenizer, rendered, list(chosen))
    rejected_scores = reward_scores(reward_model, tokenizer, rendered, list(rejected))
    return (chosen_scores > rejected_scores).float().mean().item()


def _kept(pairs: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The pairs preference_pairs would keep: the first answer truly better, or the second saying a word again."""
    return [(p, good, bad) for p, good, bad in pairs if tiny_task.preferred(p, good, bad)]


def _repeats_an_adjective(response: str) -> bool:
    adjectives = [w for w in tiny_task.words(response) if w in tiny_task.ADJECTIVES]
    return len(set(adjectives)) < len(adjectives)


@torch.no_grad()
def evaluate_world(
    policy: PreTrainedModel, reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rng: random.Random
) -> dict[str, float]:
    """SFT samples: EOS rate and true reward; greedy SFT answers: how many say an adjective twice; reward model:
    held-out pair accuracy (all pairs, and each kind of hard negative alone), correlation with true_reward."""
    n = RM["heldout_pairs"]
    accuracy = pair_accuracy(reward_model, tokenizer, tiny_task.preference_pairs(rng, n))
    hard_accuracy = pair_accuracy(reward_model, tokenizer, _kept([tiny_task.hard_negative(rng) for _ in range(n)]))
    padded = _kept([tiny_task.padded_negative(rng) for _ in range(2 * n)])
    repeated = [pair for pair in padded if _repeats_an_adjective(pair[2])]
    unrepeated = [pair for pair in padded if not _repeats_an_adjective(pair[2])]  # neutral-only or long lists
    swapped = [tiny_task.swapped_pair(rng) for _ in range(n)]
    positive_over_neutral = [  # one positive adjective against a neutral one in its place
        (p, a, b) if tiny_task.true_reward(p, a) > tiny_task.true_reward(p, b) else (p, b, a)
        for p, a, b in swapped
        if {*tiny_task.words(a)} ^ {*tiny_task.words(b)} <= tiny_task.POSITIVE_OR_NEUTRAL
        and tiny_task.true_reward(p, a) != tiny_task.true_reward(p, b)
    ]
    prompts = [tiny_task.sample_prompt(rng)[0] for _ in range(EVAL["samples"])]
    rendered = [chat_prompt(tokenizer, p) for p in prompts]
    responses, ended = zip(*sample_responses(policy, tokenizer, rendered, EVAL["max_new_tokens"]))
    greedy, _ = zip(*sample_responses(policy, tokenizer, rendered, EVAL["max_new_tokens"], greedy=True))
    true = torch.tensor([tiny_task.true_reward(p, r) for p, r in zip(prompts, responses)])
    scores = reward_scores(reward_model, tokenizer, rendered, list(responses))
    return {
        "sft_eos_rate": round(sum(ended) / len(ended), 4),
        "sft_mean_true_reward": round(true.mean().item(), 4),
        "sft_greedy_repeats_an_adjective": round(sum(map(_repeats_an_adjective, greedy)) / len(greedy), 4),
        "best_true_reward": tiny_task.BEST_TRUE_REWARD,
        "rm_heldout_pair_accuracy": round(accuracy, 4),
        "rm_hard_negative_accuracy": round(hard_accuracy, 4),
        "rm_repeated_adjective_accuracy": round(pair_accuracy(reward_model, tokenizer, repeated), 4),
        "rm_neutral_or_long_list_accuracy": round(pair_accuracy(reward_model, tokenizer, unrepeated), 4),
        "rm_positive_over_neutral_accuracy": round(pair_accuracy(reward_model, tokenizer, positive_over_neutral), 4),
        "rm_true_reward_pearson": round(torch.corrcoef(torch.stack([scores, true]))[0, 1].item(), 4),
    }
