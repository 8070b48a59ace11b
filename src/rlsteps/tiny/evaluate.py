"""How good a tiny world is: the SFT policy's EOS rate and true reward, the reward model's accuracy."""

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
    policy: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompts: list[str], max_new_tokens: int = 32
) -> list[tuple[str, bool]]:
    """(decoded response, ended with EOS) for each rendered prompt, sampled at temperature 1."""
    encoded = tokenizer(prompts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
    output = policy.generate(
        **encoded,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
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


@torch.no_grad()
def evaluate_world(
    policy: PreTrainedModel, reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rng: random.Random
) -> dict[str, float]:
    """SFT samples: EOS rate and true reward; reward model: held-out pair accuracy (all pairs, and hard negatives
    alone), correlation with true_reward."""
    accuracy = pair_accuracy(reward_model, tokenizer, tiny_task.preference_pairs(rng, RM["heldout_pairs"]))
    hard = [tiny_task.hard_negative(rng) for _ in range(RM["heldout_pairs"])]
    hard = [(p, good, bad) for p, good, bad in hard if tiny_task.true_reward(p, good) > tiny_task.true_reward(p, bad)]
    hard_accuracy = pair_accuracy(reward_model, tokenizer, hard)
    prompts = [tiny_task.sample_prompt(rng)[0] for _ in range(EVAL["samples"])]
    rendered = [chat_prompt(tokenizer, p) for p in prompts]
    responses, ended = zip(*sample_responses(policy, tokenizer, rendered, EVAL["max_new_tokens"]))
    true = torch.tensor([tiny_task.true_reward(p, r) for p, r in zip(prompts, responses)])
    scores = reward_scores(reward_model, tokenizer, rendered, list(responses))
    return {
        "sft_eos_rate": round(sum(ended) / len(ended), 4),
        "sft_mean_true_reward": round(true.mean().item(), 4),
        "best_true_reward": tiny_task.BEST_TRUE_REWARD,
        "rm_heldout_pair_accuracy": round(accuracy, 4),
        "rm_hard_negative_accuracy": round(hard_accuracy, 4),
        "rm_true_reward_pearson": round(torch.corrcoef(torch.stack([scores, true]))[0, 1].item(), 4),
    }
