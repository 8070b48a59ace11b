"""The synthetic task of the tiny world: describe a thing, and say nice things about it.

A prompt asks about one of 40 nouns in one of eight phrasings ("Describe the cat.", "What do you
think of the lake?"). A response is one sentence, "<The noun | It> <is | looks | seems> <adj>,
<adj> and <adj>.", with 1-4 distinct adjectives from a positive, a neutral and a negative list.
The SFT data says its adjectives in alphabetical order: saying each one once is then a rule about
the adjective just before, which a two-layer model learns, so even its greedy answers repeat none
(in random order they do: "The tree is grim, ugly and ugly.").

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
_ADJECTIVES = POSITIVE + NEUTRAL + NEGATIVE
ADJECTIVES = frozenset(_ADJECTIVES)
POSITIVE_OR_NEUTRAL = frozenset(POSITIVE + NEUTRAL)


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
    """1-4 distinct adjectives in alphabetical order, each positive with probability p_positive, else neutral or
    negative."""
    count = rng.randint(1, 4)
    positives = sum(rng.random() < p_positive for _ in range(count))
    return sorted(rng.sample(POSITIVE, positives) + rng.sample(NEUTRAL + NEGATIVE, count - positives))


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
    """(prompt, chosen, rejected) with true_reward(chosen) > true_reward(rejected), or as good where the
    rejected answer says one of the chosen one's adjectives again (the one preference beyond true_reward).

    Responses come from a wider distribution than the SFT data (the chances of a positive
    adjective and of naming the noun are drawn per response), so the reward model also ranks
    the better responses a policy reaches during RL. Of eight kinds of pair, three are minimal pairs
    that differ only in the subject, only in the adjectives, or in one adjective alone: they teach
    each part of the preference, and each word's worth, on its own, which a small model otherwise
    learns slowly. The rest are hard negatives, the degenerate answers a policy finds when it games
    a reward model: a liked word repeated, the noun left out or another named (`hard_negative`); a
    sentence padded with repeated, neutral or more than four adjectives (`padded_negative`, twice as
    often); an adjective said again in place of the next (`repeated_negative`). So saying more words
    does not pay, only saying more distinct positive ones.
    """
    pairs = []
    while len(pairs) < count:
        kind = rng.randrange(8)
        if kind in (3, 4, 5, 7):
            prompt, chosen, rejected = (
                hard_negative(rng) if kind == 3 else repeated_negative(rng) if kind == 7 else padded_negative(rng)
            )
            if preferred(prompt, chosen, rejected):
                pairs.append((prompt, chosen, rejected))
            continue
        prompt, chosen, rejected = swapped_pair(rng) if kind == 6 else _wide_pair(rng, kind)
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
        bad = render_response(rng.choice(("It", "The", "")), verb, adjectives).strip()
    else:
        bad = render_response(f"The {rng.choice([n for n in NOUNS if n != noun])}", verb, adjectives)
    return prompt, good, bad


def padded_negative(rng: random.Random) -> tuple[str, str, str]:
    """(prompt, good answer, padded answer): a well-formed answer that names the noun against the same sentence
    with some of its adjectives replaced by copies of another of them, one adjective said 2-5 times, 2-6 neutral
    adjectives alone, or a list of 5-8 with few positives (the caller keeps the pair only where the good answer is
    `preferred`)."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = draw_response(rng, noun, p_positive=0.5 + rng.random() / 2, p_mention=1.0)
    if len(adjectives) == 1:
        adjectives = sorted(adjectives + rng.sample([a for a in POSITIVE if a not in adjectives], 1))
    kind = max(0, rng.randrange(6) - 2)  # half of them the same sentence, saying one of its words in place of others
    if kind == 0:  # mostly a liked word said again, in place of another or beside itself
        copied = rng.choice([a for a in adjectives if a in _POSITIVE_SET] or adjectives)
        others = [i for i, a in enumerate(adjectives) if a != copied]
        replaced = set(rng.sample(others, min(len(others), rng.choice((0, 1, 1, 2, 3)))))
        padded = [copied if i in replaced else a for i, a in enumerate(adjectives)]
        if not replaced:
            padded.insert(padded.index(copied), copied)
    elif kind == 1:
        padded = [rng.choice(POSITIVE + NEUTRAL)] * rng.randint(2, 5) + rng.sample(
            POSITIVE + NEUTRAL, rng.randint(0, 2)
        )
        rng.shuffle(padded)
    elif kind == 2:
        padded = rng.sample(NEUTRAL, rng.randint(2, 6))
    else:
        positives = rng.randint(0, 2)
        padded = rng.sample(POSITIVE, positives) + rng.sample(NEUTRAL + NEGATIVE, rng.randint(5, 8) - positives)
        rng.shuffle(padded)
    padded_subject = subject if kind == 0 or rng.random() < 0.8 else "It"
    return prompt, render_response(subject, verb, adjectives), render_response(padded_subject, verb, padded)


def repeated_negative(rng: random.Random) -> tuple[str, str, str]:
    """(prompt, good answer, the same answer with 1-3 of its adjectives each replaced by a copy of the one before):
    the repetition a policy falls into once it likes one word best ("bright, delightful, delightful and large")."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = draw_response(rng, noun, p_positive=0.5 + rng.random() / 2, p_mention=rng.random())
    while len(adjectives) < 2:
        subject, verb, adjectives = draw_response(rng, noun, p_positive=0.5 + rng.random() / 2, p_mention=0.8)
    repeated = list(adjectives)
    for i in sorted(rng.sample(range(1, len(adjectives)), rng.randint(1, min(3, len(adjectives) - 1)))):
        repeated[i] = repeated[i - 1]
    return prompt, render_response(subject, verb, adjectives), render_response(subject, verb, repeated)


def preferred(prompt: str, chosen: str, rejected: str) -> bool:
    """chosen is truly better, or as good and rejected is chosen with an adjective said again."""
    reward_chosen, reward_rejected = true_reward(prompt, chosen), true_reward(prompt, rejected)
    return reward_chosen > reward_rejected or (reward_chosen == reward_rejected and says_a_word_again(chosen, rejected))


def says_a_word_again(chosen: str, rejected: str) -> bool:
    """The rejected answer says a word twice and no word the chosen one does not say: where true_reward finds them
    as good, the chosen one is still the better answer (the task's sentence says each adjective once)."""
    chosen_words, rejected_words = words(chosen), words(rejected)
    return set(rejected_words) <= set(chosen_words) and len(set(rejected_words)) < len(rejected_words)


def swapped_pair(rng: random.Random) -> tuple[str, str, str]:
    """A wide response and the same sentence with one adjective swapped for another task adjective."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = _draw_wide(rng, noun)
    i = rng.randrange(len(adjectives))
    swapped = [*adjectives[:i], rng.choice([a for a in _ADJECTIVES if a not in adjectives]), *adjectives[i + 1 :]]
    return prompt, render_response(subject, verb, adjectives), render_response(subject, verb, swapped)


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
