"""How good a tiny world is: the SFT policy's EOS rate, true reward and faults; the reward model's accuracy, probes."""

from __future__ import annotations

import random

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from rlsteps.tiny import preferences
from rlsteps.tiny import task as tiny_task
from rlsteps.tiny.hyperparameters import EVAL, RM
from rlsteps.tiny.preferences import Pair
from rlsteps.tiny.tokenizer import chat_prompt, word_token
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
def pair_accuracy(reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, pairs: list[Pair]) -> float:
    """The share of (prompt, chosen, rejected) where chosen scores strictly higher."""
    prompts, chosen, rejected = zip(*pairs)
    rendered = [chat_prompt(tokenizer, p) for p in prompts]
    chosen_scores = reward_scores(reward_model, tokenizer, rendered, list(chosen))
    rejected_scores = reward_scores(reward_model, tokenizer, rendered, list(rejected))
    return (chosen_scores > rejected_scores).float().mean().item()


@torch.no_grad()
def mean_margin(reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, pairs: list[Pair]) -> float:
    """The mean of r_second - r_first over (prompt, first, second)."""
    prompts, first, second = zip(*pairs)
    rendered = [chat_prompt(tokenizer, p) for p in prompts]
    margins = reward_scores(reward_model, tokenizer, rendered, list(second)) - reward_scores(
        reward_model, tokenizer, rendered, list(first)
    )
    return margins.mean().item()


def wrong_noun_probes(rng: random.Random, count: int) -> list[Pair]:
    """(prompt, an answer naming its noun, the same answer naming another noun), answers of the wide distribution."""
    probes = []
    for _ in range(count):
        prompt, noun = tiny_task.sample_prompt(rng)
        _, verb, adjectives = tiny_task.draw_response(rng, noun, p_positive=rng.random(), p_mention=1.0)
        other = rng.choice([n for n in tiny_task.NOUNS if n != noun])
        right, wrong = (tiny_task.render_response(f"The {n}", verb, adjectives) for n in (noun, other))
        probes.append((prompt, right, wrong))
    return probes


def positive_ladders(rng: random.Random, count: int) -> list[tuple[str, list[str]]]:
    """(prompt, five answers about its noun): one neutral adjective, then 1, 2, 3 and 4 positive ones."""
    ladders = []
    for _ in range(count):
        prompt, noun = tiny_task.sample_prompt(rng)
        verb, positives = rng.choice(tiny_task.VERBS), rng.sample(tiny_task.POSITIVE, 4)
        rungs = [[rng.choice(tiny_task.NEUTRAL)]] + [sorted(positives[:k]) for k in range(1, 5)]
        ladders.append((prompt, [tiny_task.render_response(f"The {noun}", verb, rung) for rung in rungs]))
    return ladders


@torch.no_grad()
def ladder_climbs(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, ladders: list[tuple[str, list[str]]]
) -> list[float]:
    """For each rung after the first, the share of ladders whose answer there scores above the one before."""
    prompts = [chat_prompt(tokenizer, p) for p, rungs in ladders for _ in rungs]
    scores = reward_scores(reward_model, tokenizer, prompts, [r for _, rungs in ladders for r in rungs])
    scores = scores.view(len(ladders), -1)  # [ladders, rungs]
    return [round(x, 4) for x in (scores[:, 1:] > scores[:, :-1]).float().mean(0).tolist()]


@torch.no_grad()
def repeat_shares(
    policy: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rng: random.Random, places: int
) -> dict[str, list[float]]:
    """How readily the policy says again the adjective it just said where it is about to say a positive one, for each
    positive adjective: at `places` places of positive-only task sentences that have just said it (after 0-2 other
    positive adjectives, in any order: the SFT data's alphabetical order never goes on after "wonderful", a policy
    moved by RL does), teacher-forced: r = p(the one just said) / (that + p(a positive adjective not yet said))."""
    token = {word: word_token(tokenizer, word) for word in tiny_task.POSITIVE}
    shares: dict[str, list[float]] = {}
    for last in sorted(tiny_task.POSITIVE):
        for _ in range(places):
            prompt, noun = tiny_task.sample_prompt(rng)
            said = rng.sample([word for word in tiny_task.POSITIVE if word != last], rng.randrange(3)) + [last]
            verb = rng.choice(tiny_task.VERBS)
            text = chat_prompt(tokenizer, prompt) + f"The {noun} {verb} {', '.join(said)},"
            encoded = tokenizer(text, return_tensors="pt", add_special_tokens=False)
            p = policy(**encoded).logits[0, -1].float().softmax(-1)
            again = p[token[last]].item()
            fresh = sum(p[token[word]].item() for word in tiny_task.POSITIVE if word not in said)
            shares.setdefault(last, []).append(again / (again + fresh))
    return shares


@torch.no_grad()
def evaluate_world(
    policy: PreTrainedModel, reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rng: random.Random
) -> dict[str, float]:
    """SFT samples: EOS rate, true reward and faults; greedy SFT answers: how many say a word twice; reward model:
    held-out pair accuracy (all pairs, and each kind alone), how often a wrong noun scores at least as high as the
    right one, how often one more positive adjective scores higher (1 to 4), correlation with true_reward."""
    n = RM["heldout_pairs"]
    accuracy = {
        "rm_heldout_pair_accuracy": pair_accuracy(reward_model, tokenizer, preferences.preference_pairs(rng, n))
    }
    for name, kind in preferences.PAIR_KINDS.items():
        pairs = [preferences.draw_pair(kind, rng) for _ in range(n // 2)]
        accuracy[f"rm_accuracy_{name.replace(' ', '_')}"] = pair_accuracy(
            reward_model, tokenizer, [pair for pair in pairs if pair is not None]
        )
    probes = wrong_noun_probes(rng, n // 2)
    ties = preferences.tie_pairs(rng, n // 2)
    prompts = [tiny_task.sample_prompt(rng)[0] for _ in range(EVAL["samples"])]
    rendered = [chat_prompt(tokenizer, p) for p in prompts]
    responses, ended = zip(*sample_responses(policy, tokenizer, rendered, EVAL["max_new_tokens"]))
    greedy, _ = zip(*sample_responses(policy, tokenizer, rendered, EVAL["max_new_tokens"], greedy=True))
    true = torch.tensor([tiny_task.true_reward(p, r) for p, r in zip(prompts, responses)])
    scores = reward_scores(reward_model, tokenizer, rendered, list(responses))
    return {
        "sft_eos_rate": round(sum(ended) / len(ended), 4),
        "sft_mean_true_reward": round(true.mean().item(), 4),
        "sft_faulty": round(sum(bool(tiny_task.faults(p, r)) for p, r in zip(prompts, responses)) / len(prompts), 4),
        "sft_greedy_repeats_a_word": round(sum(map(tiny_task.repeats_a_word, greedy)) / len(greedy), 4),
        "best_true_reward": tiny_task.BEST_TRUE_REWARD,
        **{key: round(value, 4) for key, value in accuracy.items()},
        "rm_wrong_noun_at_least_as_high": round(1.0 - pair_accuracy(reward_model, tokenizer, probes), 4),
        "rm_one_more_positive_higher": ladder_climbs(reward_model, tokenizer, positive_ladders(rng, n // 2)),
        # a neutral adjective more is worth nothing to the true reward; a positive one more, ADJECTIVE_REWARD
        "rm_one_more_neutral_mean_change": round(mean_margin(reward_model, tokenizer, ties), 3),
        "rm_true_reward_pearson": round(torch.corrcoef(torch.stack([scores, true]))[0, 1].item(), 4),
    }
