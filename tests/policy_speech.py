"""What a tiny policy says, measured against the tiny task's own format: the learning tests' second oracle.

The hidden true reward (rlsteps.tiny.task.true_reward) can rise while a policy stops ending its answers or says a
bag of liked words. So a learning test also reads what the trained policy says, beside what the SFT policy it started
from says, both generated here from the validation prompts by the same code (rlsteps' own loader, Hugging Face
generate, the tiny chat template), and asks that nothing the SFT policy did well got worse:

    ended        responses that end with EOS within the token budget
    well_formed  responses that are the task's sentence, "<The NOUN | It> <is | looks | seems> <adj>, <adj> and
                 <adj>.": the prompt's own noun (never another), 1-4 distinct adjectives of the task's lists
    repeated     responses that say a word twice (a liked word repeated is the classic reward hack)
    words_used   different words over all responses but the adjectives, per prompt: the nouns and the sentence
                 around the adjectives stay; a policy that answers every prompt alike loses them. The adjectives are
                 left out because learning the task narrows them: a policy at the best true reward says positive ones
                 only (tiny world v16: with them counted, rl/reinforce's sampled answers went from 2.03 words a
                 prompt to 1.50, every positive adjective still said)
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from rlsteps.tiny import task as tiny_task

ADJECTIVES = frozenset(tiny_task.POSITIVE + tiny_task.NEUTRAL + tiny_task.NEGATIVE)
SENTENCE = re.compile(
    r"(?:The (?P<noun>[a-z]+)|It) (?:is|looks|seems) (?P<adjectives>[a-z]+(?:(?:, [a-z]+)* and [a-z]+)?)\."
)
MAX_ADJECTIVES = 4

# How much worse than the SFT policy a trained one may look before a test calls it a regression: fractions of rows
# (a few rows of 128 may move with a platform's rounding), and for words_used a share of the SFT policy's figure.
SLACK = {"ended": 0.03, "well_formed": 0.03, "repeated": 0.03}
# Sampled at temperature 1, a trained policy says more adjectives than the SFT policy, each a place to say one again:
# on the tiny world v17 its sampled answers said a word again more often than the SFT policy's in 20 of 45 runs, by up
# to 14 points (benchmarks/README.md), and a sampled answer was held to 16 points. On v20, whose policy's SFT pushes
# down the adjectives already said, by 4.9 points at most over the 45 runs' last steps; here, where the final policy
# answers the validation prompts 4 times each, rl/reinforce at run seed 2 says a word again in 4.7% of them (the SFT
# policy 0%) and keeps the task's sentence in 92.2% (100%). A sampled answer is held to that and a row or two of 128
# more; greedy answers, which validation reads, to SLACK. On v21 no fault grows by more than 2.3 points of the
# rollouts in any of the 45 runs (benchmarks/README.md)
SAMPLED_SLACK = {**SLACK, "well_formed": 0.1, "repeated": 0.06}
WORDS_USED_SHARE = 0.75
CHECKS = ("ended", "well_formed", "repeated", "words_used")


@dataclass(frozen=True)
class Speech:
    rows: int
    ended: float
    well_formed: float
    repeated: float
    words_used: float  # different words over all responses, divided by the number of distinct prompts

    def __str__(self) -> str:
        return (
            f"{self.rows} responses: ended {self.ended:.3f}, well formed {self.well_formed:.3f}, "
            f"repeated a word {self.repeated:.3f}, words used per prompt {self.words_used:.2f}"
        )


def well_formed(prompt: str, response: str) -> bool:
    """The task's sentence about the prompt's noun (or "It"), with 1-4 distinct adjectives from the task's lists."""
    match = SENTENCE.fullmatch(response)
    if match is None or (match["noun"] is not None and match["noun"] != tiny_task.prompt_noun(prompt)):
        return False
    adjectives = match["adjectives"].replace(" and ", ", ").split(", ")
    return (
        len(adjectives) <= MAX_ADJECTIVES
        and len(set(adjectives)) == len(adjectives)
        and ADJECTIVES.issuperset(adjectives)
    )


def repeats_a_word(response: str) -> bool:
    counts = Counter(tiny_task.words(response))
    return any(count > 1 for count in counts.values())


def measure(samples: list[tuple[str, str, bool]]) -> Speech:
    """Figures of (user prompt, response, ended) rows."""
    if not samples:
        raise ValueError("no samples to measure")
    n = len(samples)
    vocabulary = {word for _, response, _ in samples for word in tiny_task.words(response)} - ADJECTIVES
    return Speech(
        rows=n,
        ended=sum(ended for *_, ended in samples) / n,
        well_formed=sum(well_formed(prompt, response) for prompt, response, _ in samples) / n,
        repeated=sum(repeats_a_word(response) for _, response, _ in samples) / n,
        words_used=len(vocabulary) / len({prompt for prompt, _, _ in samples}),
    )


def regressions(
    trained: Speech, sft: Speech, checks: tuple[str, ...] = CHECKS, slack: dict[str, float] = SLACK
) -> list[str]:
    """What the trained policy does worse than the SFT policy did, beyond the slack: [] when nothing."""
    worse = []
    for name in checks:
        before, after = getattr(sft, name), getattr(trained, name)
        if name == "repeated":
            regressed = after > before + slack[name]
        elif name == "words_used":
            regressed = after < WORDS_USED_SHARE * before
        else:
            regressed = after < before - slack[name]
        if regressed:
            worse.append(f"{name}: {before:.3f} (SFT) -> {after:.3f}")
    return worse


def validation_prompts(prompt_file: Path) -> list[str]:
    """The user texts of a tiny prompt file (one user message a record)."""
    return [json.loads(line)["messages"][-1]["content"] for line in prompt_file.read_text().splitlines()]


@torch.no_grad()
def speak(
    policy_dir: Path, prompts: list[str], *, samples_per_prompt: int = 4, seed: int = 0, max_new_tokens: int = 32
) -> list[tuple[str, str, bool]]:
    """(prompt, response, ended) of a policy (a Hugging Face folder or a Megatron checkpoint) at temperature 1,
    `samples_per_prompt` a prompt from a fixed seed; samples_per_prompt=0: one greedy response a prompt."""
    from rlsteps.engine.policy.model import load_policy
    from rlsteps.tiny.tokenizer import chat_prompt

    model, tokenizer = load_policy(policy_dir)
    model.eval()
    rows = prompts * max(samples_per_prompt, 1)
    encoded = tokenizer(
        [chat_prompt(tokenizer, p) for p in rows],
        padding=True,
        padding_side="left",
        add_special_tokens=False,
        return_tensors="pt",
    )
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if samples_per_prompt else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        output = model.generate(
            **encoded,
            **(sampling or {"do_sample": False}),
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    results = []
    for prompt, row in zip(rows, output[:, encoded["input_ids"].shape[1] :].tolist()):
        ended = tokenizer.eos_token_id in row
        response = row[: row.index(tokenizer.eos_token_id)] if ended else row
        results.append((prompt, tokenizer.decode(response, skip_special_tokens=True), ended))
    return results


def speech(policy_dir: Path, prompts: list[str], **options) -> Speech:
    return measure(speak(policy_dir, prompts, **options))


# Greedy answers are held to every check too: the tiny SFT data says its adjectives in alphabetical order, so the SFT
# policy's own greedy answers are the task's sentence and repeat no adjective (in random order a two-layer model's
# greedy answer did: "The tree is grim, ugly and ugly."), and a trained policy's must stay so.
GREEDY_CHECKS = CHECKS


@functools.lru_cache(maxsize=8)
def _baseline(sft_dir: str, prompts: tuple[str, ...], samples_per_prompt: int) -> Speech:
    return speech(Path(sft_dir), list(prompts), samples_per_prompt=samples_per_prompt)


def against_sft(policy_dir: Path, sft_dir: Path, prompts: list[str]) -> tuple[str, list[str]]:
    """A trained policy beside the SFT policy it started from, sampled (4 a prompt) and greedy: their figures as
    text, and what got worse ([] when nothing). The SFT figures are measured once per process."""
    lines, worse = [], []
    modes = (("sampled", 4, CHECKS, SAMPLED_SLACK), ("greedy", 0, GREEDY_CHECKS, SLACK))
    for mode, samples_per_prompt, checks, slack in modes:
        sft = _baseline(str(sft_dir), tuple(prompts), samples_per_prompt)
        trained = speech(policy_dir, prompts, samples_per_prompt=samples_per_prompt)
        lines += [f"{mode} SFT: {sft}", f"{mode} trained: {trained}"]
        worse += [f"{mode} {regression}" for regression in regressions(trained, sft, checks, slack)]
    return "\n".join(lines), worse
