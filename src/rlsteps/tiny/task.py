"""The synthetic task of the tiny world: describe a thing, and say nice things about it.

A prompt asks about one of 40 nouns in one of eight phrasings ("Describe the cat.", "What do you
think of the lake?"). A response is one sentence, "<The noun | It> <is | looks | seems> <adj>,
<adj> and <adj>.", with 1-4 distinct adjectives from a positive, a neutral and a negative list.

The hidden preference (`true_reward`) is a pure function of the text:
    +1.0  if the response names the prompt's noun
    +0.5  per distinct positive adjective (at most 4 count)
    -0.5  per negative adjective (neutral ones count 0)
so the best achievable reward is 3.0 ("The cat is kind, lovely, bright and gentle.").

The SFT data leaves room for RL: it names the noun 60% of the time (else says "It") and draws
each adjective from the positive list with probability 0.25, so it averages about 0.4. A policy
learns the preference by moving probability mass between words it already uses, which rejection
sampling, RLOO and GRPO do in a few minutes on a CPU. The noun always ends the prompt, so a
two-layer model learns to copy it in a few hundred steps. Responses never name a wrong noun,
so the reward model learns "names the subject" rather than checking it against the prompt.

All text comes from `random.Random(seed)`, so it is the same on every platform.
"""

from __future__ import annotations

import random
import re

NOUNS = (
    "cat", "dog", "horse", "river", "mountain", "garden", "house", "castle", "forest", "bridge",
    "lamp", "chair", "table", "ship", "train", "city", "village", "flower", "tree", "bird",
    "apple", "cake", "book", "clock", "window", "road", "lake", "cloud", "island", "tower",
    "piano", "violin", "kettle", "teapot", "market", "church", "school", "harbor", "desert", "meadow",
)  # fmt: skip
POSITIVE = (
    "bright", "cheerful", "gentle", "lovely", "kind", "graceful",
    "elegant", "charming", "delightful", "wonderful", "brilliant", "friendly",
)  # fmt: skip
NEUTRAL = ("tall", "round", "quiet", "old", "small", "large", "plain", "common", "square", "heavy")
NEGATIVE = (
    "dull", "ugly", "rusty", "broken", "gloomy", "nasty",
    "smelly", "awful", "dirty", "boring", "grim", "clumsy",
)  # fmt: skip
PROMPT_PHRASINGS = (  # the noun always ends the prompt, which makes copying it easy to learn
    "Describe the {noun}.",
    "Tell me about the {noun}.",
    "Write one sentence about the {noun}.",
    "Give a short description of the {noun}.",
    "Say something about the {noun}.",
    "How would you describe the {noun}?",
    "What do you think of the {noun}?",
    "Talk about the {noun}.",
)
VERBS = ("is", "looks", "seems")

MENTION_REWARD = 1.0
ADJECTIVE_REWARD = 0.5
MAX_COUNTED_POSITIVES = 4
BEST_TRUE_REWARD = MENTION_REWARD + ADJECTIVE_REWARD * MAX_COUNTED_POSITIVES

SFT_P_POSITIVE = 0.25
SFT_P_MENTION = 0.6  # the rest of the time the subject is "It"

_WORD = re.compile(r"[a-z]+")
_NOUN_SET, _POSITIVE_SET, _NEGATIVE_SET = frozenset(NOUNS), frozenset(POSITIVE), frozenset(NEGATIVE)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def prompt_noun(prompt: str) -> str:
    """The noun a prompt asks about: the last task noun in it (works on raw and chat-rendered text)."""
    nouns = [w for w in words(prompt) if w in _NOUN_SET]
    if not nouns:
        raise ValueError(f"no task noun in prompt {prompt!r}: tiny prompts name one of rlsteps.tiny.task.NOUNS")
    return nouns[-1]


def true_reward(prompt: str | list[dict[str, str]], response: str) -> float:
    """The hidden preference: mention the prompt's noun, more positive and fewer negative adjectives. The prompt is
    its text or its chat messages (a reward function's first argument)."""
    if not isinstance(prompt, str):
        prompt = " ".join(message["content"] for message in prompt)
    response_words = words(response)
    mentions_noun = prompt_noun(prompt) in response_words
    positives = len(set(response_words) & _POSITIVE_SET)
    negatives = sum(w in _NEGATIVE_SET for w in response_words)
    return (
        MENTION_REWARD * mentions_noun
        + ADJECTIVE_REWARD * min(positives, MAX_COUNTED_POSITIVES)
        - ADJECTIVE_REWARD * negatives
    )


def all_prompts() -> list[str]:
    return [phrasing.format(noun=noun) for noun in NOUNS for phrasing in PROMPT_PHRASINGS]


def join_adjectives(adjectives: list[str]) -> str:
    """["a"] -> "a"; ["a", "b", "c"] -> "a, b and c"."""
    if len(adjectives) == 1:
        return adjectives[0]
    return f"{', '.join(adjectives[:-1])} and {adjectives[-1]}"


def draw_response(
    rng: random.Random, noun: str, p_positive: float = SFT_P_POSITIVE, p_mention: float = SFT_P_MENTION
) -> tuple[str, str, list[str]]:
    """(subject, verb, adjectives) of a response about `noun`; the subject is "The <noun>" or "It"."""
    subject = f"The {noun}" if rng.random() < p_mention else "It"
    return subject, rng.choice(VERBS), _draw_adjectives(rng, p_positive)


def _draw_adjectives(rng: random.Random, p_positive: float) -> list[str]:
    """1-4 distinct adjectives, each positive with probability p_positive, else neutral or negative."""
    count = rng.randint(1, 4)
    positives = sum(rng.random() < p_positive for _ in range(count))
    adjectives = rng.sample(POSITIVE, positives) + rng.sample(NEUTRAL + NEGATIVE, count - positives)
    rng.shuffle(adjectives)
    return adjectives


def render_response(subject: str, verb: str, adjectives: list[str]) -> str:
    return f"{subject} {verb} {join_adjectives(adjectives)}."


def sample_response(rng: random.Random, noun: str, p_positive: float = SFT_P_POSITIVE) -> str:
    """A response from the SFT distribution (or with another chance of a positive adjective)."""
    return render_response(*draw_response(rng, noun, p_positive))


def sample_prompt(rng: random.Random) -> tuple[str, str]:
    """A random (prompt, noun) from the whole task."""
    noun = rng.choice(NOUNS)
    return rng.choice(PROMPT_PHRASINGS).format(noun=noun), noun


def sft_examples(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(prompt, response) pairs drawn from the SFT distribution."""
    examples = []
    for _ in range(count):
        prompt, noun = sample_prompt(rng)
        examples.append((prompt, sample_response(rng, noun)))
    return examples


def preference_pairs(rng: random.Random, count: int) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) with true_reward(chosen) > true_reward(rejected).

    Responses come from a wider distribution than the SFT data (the chances of a positive
    adjective and of naming the noun are drawn per response), so the reward model also ranks
    the better responses a policy reaches during RL. Half of the pairs are minimal pairs that
    differ only in the subject or only in the adjectives: they teach each part of the preference
    on its own, which a small model otherwise learns slowly for the noun. A quarter are hard
    negatives (`hard_negative`): the degenerate answers a policy finds when it games a reward
    model, so that repeating a liked word or dropping the noun does not pay.
    """
    pairs = []
    while len(pairs) < count:
        kind = rng.randrange(4)
        if kind == 3:
            prompt, chosen, rejected = hard_negative(rng)
        else:
            prompt, chosen, rejected = _wide_pair(rng, kind)
        reward_chosen, reward_rejected = true_reward(prompt, chosen), true_reward(prompt, rejected)
        if reward_chosen != reward_rejected:
            pairs.append((prompt, chosen, rejected) if reward_chosen > reward_rejected else (prompt, rejected, chosen))
    return pairs


def _wide_pair(rng: random.Random, kind: int) -> tuple[str, str, str]:
    """Two responses from the wide distribution; kind 1 shares the adjectives, kind 2 the subject."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = _draw_wide(rng, noun)
    other_subject, _, other_adjectives = _draw_wide(rng, noun)
    if kind == 1:
        other_adjectives = adjectives
    elif kind == 2:
        other_subject = subject
    return prompt, render_response(subject, verb, adjectives), render_response(other_subject, verb, other_adjectives)


def hard_negative(rng: random.Random) -> tuple[str, str, str]:
    """(prompt, good answer, degenerate answer): a liked word repeated (with or without the sentence around it),
    the noun left out, or the wrong noun named, each against a well-formed answer that names the noun."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = draw_response(rng, noun, p_positive=0.5 + rng.random() / 2, p_mention=1.0)
    good = render_response(subject, verb, adjectives)
    kind = rng.randrange(3)
    if kind == 0:
        repeated = " ".join([rng.choice(POSITIVE)] * rng.randint(2, 12))
        bad = f"{subject} {verb} {repeated}." if rng.random() < 0.5 else repeated
    elif kind == 1:
        bad = render_response(rng.choice(("It", "")), verb, adjectives).strip()
    else:
        bad = render_response(f"The {rng.choice([n for n in NOUNS if n != noun])}", verb, adjectives)
    return prompt, good, bad


def _draw_wide(rng: random.Random, noun: str) -> tuple[str, str, list[str]]:
    return draw_response(rng, noun, p_positive=rng.random(), p_mention=rng.random())


def prompt_records(seed: int, train_count: int, val_count: int) -> tuple[list[dict], list[dict]]:
    """Disjoint train and validation prompt records: {"id", "messages": [{"role": "user", ...}]}."""
    prompts = all_prompts()
    if train_count + val_count > len(prompts):
        raise ValueError(f"the tiny task has {len(prompts)} distinct prompts, asked for {train_count + val_count}")
    random.Random(seed).shuffle(prompts)

    def records(split: str, texts: list[str]) -> list[dict]:
        return [
            {"id": f"tiny-{split}-{i:04d}", "messages": [{"role": "user", "content": text}]}
            for i, text in enumerate(texts)
        ]

    return records("train", prompts[:train_count]), records("val", prompts[train_count : train_count + val_count])


def tokenizer_corpus(rng: random.Random, response_count: int) -> list[str]:
    """Every prompt and many responses, so every task word becomes a token or two."""
    responses = [sample_response(rng, rng.choice(NOUNS), p_positive=0.5) for _ in range(response_count)]
    return all_prompts() + responses
