"""The synthetic task of the tiny world: describe a thing, and say nice things about it.

A prompt asks about one of 40 nouns in one of eight phrasings ("Describe the cat.", "What do you
think of the lake?"). A response is one sentence, "<The noun | It> <is | looks | seems> <adj>,
<adj> and <adj>.", with 1-4 distinct adjectives from a positive, a neutral and a negative list.
The SFT data says its adjectives in alphabetical order: saying each one once is then a rule about
the adjective just before, which the tiny policy learns, so even its greedy answers repeat none
(in random order they do: "The tree is grim, ugly and ugly.").

The hidden preference (`true_reward`) is a pure function of the text. It rewards the task's whole sentence only:
"<The NOUN | It> <is | looks | seems> <adj>, <adj> and <adj>." with the prompt's own noun (or "It"), 1-4 distinct
adjectives of the task's lists, joined by commas and one "and" before the last, and a full stop at the end. Such a
sentence scores
    +1.0  if it names the prompt's noun
    +0.5  per positive adjective
    -0.5  per negative adjective (neutral ones count 0)
so the best achievable reward is 3.0 ("The cat is bright, gentle, kind and lovely."). Any other answer scores that
sum capped at 0.0: nothing for the words it gets right, and its negative adjectives still cost ("The cat is kind,
lovely, bright, gentle." without its "and", "The cat is kind, kind, kind and kind.", a list of six, a sentence that
never ends: 0.0). `faults` names what makes an answer other than the task's sentence (a wrong noun, a broken word, a
word said again, more than four adjectives, a list without its "and", any other form), each of which an answer that
games a reward model often has.

The SFT data leaves room for RL: it names the noun 60% of the time (else says "It") and draws
each adjective from the positive list with probability 0.3 (else negative one time in four, neutral
otherwise), so the SFT policy's sampled answers average about 0.6. A policy
learns the preference by moving probability mass between words it already uses, which rejection
sampling, RLOO and GRPO do in a few minutes on a CPU. The noun always ends the prompt, so the
tiny policy learns to copy it in a few hundred steps. The SFT data never names a wrong noun, so the reward
model learns to check the noun against the prompt's from pairs made for it (rlsteps.tiny.preferences).

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

SFT_P_POSITIVE = 0.3
# a non-positive adjective is negative this often: at 12 in 22 (the lists' own share) each extra adjective lost 0.08
# of true reward in expectation, so RL first learnt to say fewer of them and never found three or four positives
SFT_NEGATIVE_SHARE = 0.25
SFT_P_MENTION = 0.6  # the rest of the time the subject is "It"

_WORD = re.compile(r"[a-z]+")
_TOKEN = re.compile(r"[^\s,.]+")  # what a reader takes for a word: anything between spaces, commas and full stops
_NOUN_SET, _POSITIVE_SET, _NEGATIVE_SET = frozenset(NOUNS), frozenset(POSITIVE), frozenset(NEGATIVE)
_ADJECTIVES = POSITIVE + NEUTRAL + NEGATIVE
ADJECTIVES = frozenset(_ADJECTIVES)
_KINDS = {"positive": POSITIVE, "negative": NEGATIVE, "neutral": NEUTRAL}
POSITIVE_OR_NEUTRAL = frozenset(POSITIVE + NEUTRAL)
SENTENCE_WORDS = frozenset(("the", "it", "and", *VERBS, *NOUNS, *_ADJECTIVES))  # every word a task sentence says
_ADJECTIVE_PATTERN = f"(?:{'|'.join(_ADJECTIVES)})"
# the task's sentence: a subject, a verb, 1-4 adjectives joined as join_adjectives joins them, a full stop (faults
# checks what a pattern cannot: the noun is the prompt's, no adjective said twice, at most four)
_SENTENCE = re.compile(
    f"(?:The (?:{'|'.join(NOUNS)})|It) (?:{'|'.join(VERBS)}) "
    f"{_ADJECTIVE_PATTERN}(?:(?:, {_ADJECTIVE_PATTERN})* and {_ADJECTIVE_PATTERN})?\\."
)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def prompt_noun(prompt: str) -> str:
    """The noun a prompt asks about: the last task noun in it (works on raw and chat-rendered text)."""
    nouns = [w for w in words(prompt) if w in _NOUN_SET]
    if not nouns:
        raise ValueError(f"no task noun in prompt {prompt!r}: tiny prompts name one of rlsteps.tiny.task.NOUNS")
    return nouns[-1]


def _prompt_text(prompt: str | list[dict[str, str]]) -> str:
    return prompt if isinstance(prompt, str) else " ".join(message["content"] for message in prompt)


def true_reward(prompt: str | list[dict[str, str]], response: str) -> float:
    """The hidden preference: the task's sentence, naming the prompt's noun, with more positive and fewer negative
    adjectives; any other answer its words' sum capped at 0.0 (the module's docstring). The prompt is its text or its
    chat messages (a reward function's first argument)."""
    score = words_score(prompt, response)
    return score if not faults(prompt, response) else min(score, 0.0)


def words_score(prompt: str | list[dict[str, str]], response: str) -> float:
    """What the response's words are worth, whatever their form: the noun, each distinct positive adjective (at most
    four count), each negative one against it. The true reward of a task sentence; the lenient preference an answer
    that is no sentence can game ("bright, charming, friendly, old, old, old")."""
    response_words = words(response)
    mentions_noun = prompt_noun(_prompt_text(prompt)) in response_words
    positives = len(set(response_words) & _POSITIVE_SET)
    negatives = sum(w in _NEGATIVE_SET for w in response_words)
    return (
        MENTION_REWARD * mentions_noun
        + ADJECTIVE_REWARD * min(positives, MAX_COUNTED_POSITIVES)
        - ADJECTIVE_REWARD * negatives
    )


def names_a_wrong_noun(prompt: str | list[dict[str, str]], response: str) -> bool:
    """The response names a task noun other than the prompt's (the noun a reward model that never checks it lets
    through)."""
    noun = prompt_noun(_prompt_text(prompt))
    return any(w in _NOUN_SET and w != noun for w in words(response))


def has_a_broken_word(response: str) -> bool:
    """The response holds a word outside the task's sentence ("The housegh", "The\ufffd looks"): what a policy says
    once it spells by token rather than by word."""
    return any(word.lower() not in SENTENCE_WORDS for word in _TOKEN.findall(response))


def repeats_a_word(response: str) -> bool:
    response_words = words(response)
    return len(set(response_words)) < len(response_words)


def adjective_count(response: str) -> int:
    return sum(w in ADJECTIVES for w in words(response))


def lacks_its_and(response: str) -> bool:
    """A list of two or more adjectives without the "and" before its last ("The cat is kind, lovely, bright.")."""
    return adjective_count(response) > 1 and "and" not in words(response)


def off_the_sentence_form(response: str) -> bool:
    """Not "<The NOUN | It> <verb> <adj>, <adj> and <adj>." in one sentence: words out of place, two sentences, no
    full stop, nothing said."""
    return _SENTENCE.fullmatch(response.strip()) is None


def faults(prompt: str | list[dict[str, str]], response: str) -> list[str]:
    """What makes this response other than the task's sentence: [] for the sentence itself, the faults of an answer
    that games a reward model otherwise (the first that apply of the named ones, then "another form" where the words
    are right but their order is not)."""
    found = {
        "a wrong noun": names_a_wrong_noun(prompt, response),
        "a broken word": has_a_broken_word(response),
        "a word said again": repeats_a_word(response),
        "more than four adjectives": adjective_count(response) > MAX_COUNTED_POSITIVES,
        'a list without its "and"': lacks_its_and(response),
    }
    named = [fault for fault, present in found.items() if present]
    return named or (["another form"] if off_the_sentence_form(response) else [])


def is_task_sentence(prompt: str | list[dict[str, str]], response: str) -> bool:
    return not faults(prompt, response)


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
    """1-4 distinct adjectives in alphabetical order, each positive with probability p_positive, else negative with
    probability SFT_NEGATIVE_SHARE, else neutral."""
    count = rng.randint(1, 4)
    kinds = [
        "positive" if rng.random() < p_positive else "negative" if rng.random() < SFT_NEGATIVE_SHARE else "neutral"
        for _ in range(count)
    ]
    drawn = [rng.sample(words, kinds.count(kind)) for kind, words in _KINDS.items()]
    return sorted(sum(drawn, []))


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


def unordered_examples(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(prompt, response) pairs whose 2-4 adjectives come in any order, positive ones with a chance drawn per answer:
    the lists the SFT data never says (it says them in alphabetical order), where a policy moved by RL says them."""
    examples = []
    for _ in range(count):
        prompt, noun = sample_prompt(rng)
        subject, verb, adjectives = draw_response(rng, noun, p_positive=rng.random(), p_mention=rng.random())
        while len(adjectives) < 2:
            adjectives = _draw_adjectives(rng, p_positive=rng.random())
        rng.shuffle(adjectives)
        examples.append((prompt, render_response(subject, verb, adjectives)))
    return examples


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
