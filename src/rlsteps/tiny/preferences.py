"""The preference pairs the tiny reward model learns from: (prompt, chosen, rejected), the chosen answer the better.

Better is a higher true reward (rlsteps.tiny.task.true_reward), or one as high and free of the faults no task
sentence has where the other has one (`task.faults`: a wrong noun, a broken word, a word said again, more than four
adjectives): "It is kind." over "The dog is kind." when the prompt asks about the cat.

Answers come from a wider distribution than the SFT data (the chances of a positive adjective and of naming the noun
are drawn per answer), so the reward model also ranks the better answers a policy reaches during RL. Most pairs are
minimal: two answers that differ in one thing, which teaches that thing's worth on its own (a small model otherwise
learns it slowly). The rest are the answers a policy finds when it games a reward model, each under a good one.
The kinds, and their shares of the pairs (PAIR_KINDS):

    wide             two answers of the wide distribution, alike in their subject, their adjectives, or neither
    swapped          one adjective swapped for another task adjective
    more positives   one positive adjective more (added, or in place of another): each one's worth up to four, and
                     a fifth against four
    wrong noun       the prompt's noun, or "It", against another noun: the noun checked against the prompt's
    broken word      a word broken ("The housegh", "The hou", "bright\ufffd", two words run together)
    hard             a liked word repeated, the noun left out or another named (`hard_negative`)
    padded           repeated, neutral or more than four adjectives (`padded_negative`)
    repeated         an adjective said twice in a row, or again in place of the next (`repeated_negative`)
    off form         the same words out of the sentence's form: no "and", "and" between each, no commas, no full
                     stop, the noun or the verb or both left out (`off_form_negative`)
    restarted        the sentence started again and again, run together (`restarted_negative`)

Beside them, each step holds RM["tie_pairs"] ties (`neutral_tie`): answers equal in true reward, one with a neutral
adjective more or another in its place, which the reward model learns to score alike.

The build's first steps train on wrong-noun pairs alone (NOUN_FIRST).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from rlsteps.tiny.task import (
    MAX_COUNTED_POSITIVES,
    NEGATIVE,
    NEUTRAL,
    NOUNS,
    POSITIVE,
    VERBS,
    draw_response,
    faults,
    has_a_broken_word,
    join_adjectives,
    render_response,
    sample_prompt,
    true_reward,
    words_score,
)

Pair = tuple[str, str, str]  # (prompt, one answer, another) or, ordered, (prompt, chosen, rejected)
_POSITIVE_SET = frozenset(POSITIVE)
_ADJECTIVE_LIST = POSITIVE + NEUTRAL + NEGATIVE


def preference_pairs(rng: random.Random, count: int, kinds: dict[str, PairKind] | None = None) -> list[Pair]:
    """`count` (prompt, chosen, rejected) of the given kinds (PAIR_KINDS by default), in their shares."""
    kinds = list((kinds or PAIR_KINDS).values())
    pairs = []
    while len(pairs) < count:
        pair = draw_pair(rng.choices(kinds, weights=[kind.share for kind in kinds])[0], rng)
        if pair is not None:
            pairs.append(pair)
    return pairs


def draw_pair(kind: PairKind, rng: random.Random) -> Pair | None:
    """A pair of the kind, ordered; None where neither answer is better, or a degenerate answer's words are worth more
    than the good one's (`words_score`: a list padded with positive adjectives against a short sentence). The strict
    true reward prefers the sentence there too, but a reward model taught so learnt that more positive adjectives
    score lower (one more scored higher in 77-88% of probes, against 99.6% without such pairs); the fault itself is
    taught by the pairs that keep the words (off form, repeated, four positives and a fifth)."""
    prompt, first, second = kind.make(rng)
    if kind.degenerate_second:
        keep = preferred(prompt, first, second) and words_score(prompt, first) >= words_score(prompt, second)
        return (prompt, first, second) if keep else None
    return ordered(prompt, first, second)


def ordered(prompt: str, first: str, second: str) -> Pair | None:
    """(prompt, better, worse), or None where neither answer is better."""
    if preferred(prompt, first, second):
        return prompt, first, second
    if preferred(prompt, second, first):
        return prompt, second, first
    return None


def preferred(prompt: str, chosen: str, rejected: str) -> bool:
    """chosen has the higher true reward, or as high with no fault where rejected has one."""
    reward_chosen, reward_rejected = true_reward(prompt, chosen), true_reward(prompt, rejected)
    if reward_chosen != reward_rejected:
        return reward_chosen > reward_rejected
    return not faults(prompt, chosen) and bool(faults(prompt, rejected))


def draw_wide(rng: random.Random, noun: str) -> tuple[str, str, list[str]]:
    return draw_response(rng, noun, p_positive=rng.random(), p_mention=rng.random())


def wide_pair(rng: random.Random) -> Pair:
    """Two answers of the wide distribution: the same adjectives, the same subject, or neither alike."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = draw_wide(rng, noun)
    other_subject, _, other_adjectives = draw_wide(rng, noun)
    alike = rng.randrange(3)
    if alike == 1:
        other_adjectives = adjectives
    elif alike == 2:
        other_subject = subject
    return prompt, render_response(subject, verb, adjectives), render_response(other_subject, verb, other_adjectives)


def swapped_pair(rng: random.Random) -> Pair:
    """A wide answer and the same sentence with one adjective swapped for another task adjective."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = draw_wide(rng, noun)
    i = rng.randrange(len(adjectives))
    swapped = [*adjectives[:i], rng.choice([a for a in _ADJECTIVE_LIST if a not in adjectives]), *adjectives[i + 1 :]]
    return prompt, render_response(subject, verb, adjectives), render_response(subject, verb, swapped)


def more_positives_pair(rng: random.Random) -> Pair:
    """An answer with 0-3 positive adjectives (or four) and the same with one more: added in its alphabetical place,
    or in place of one of its other adjectives."""
    prompt, noun = sample_prompt(rng)
    subject = f"The {noun}" if rng.random() < 0.8 else "It"
    positives = rng.randint(0, 4)
    others = rng.sample(NEUTRAL + NEGATIVE, rng.randint(0 if positives else 1, 4 - positives))
    adjectives = rng.sample(POSITIVE, positives) + others
    extra = rng.choice([a for a in POSITIVE if a not in adjectives])
    if others and rng.random() < 0.5:
        more = [extra if a == others[0] else a for a in adjectives]
    else:
        more = adjectives + [extra]  # four positives and a fifth: no better, and not the task's sentence
    verb = rng.choice(("is", "looks", "seems"))
    return prompt, render_response(subject, verb, sorted(adjectives)), render_response(subject, verb, sorted(more))


def wrong_noun_pair(rng: random.Random) -> Pair:
    """The same sentence about the prompt's noun (or "It") and about another noun."""
    prompt, noun = sample_prompt(rng)
    _, verb, adjectives = draw_response(rng, noun, p_positive=rng.random(), p_mention=1.0)
    other = rng.choice([n for n in NOUNS if n != noun])
    subject = f"The {noun}" if rng.random() < 0.75 else "It"
    return prompt, render_response(subject, verb, adjectives), render_response(f"The {other}", verb, adjectives)


def broken_word_pair(rng: random.Random) -> Pair:
    """A wide answer and the same with one of its words broken."""
    prompt, noun = sample_prompt(rng)
    good = render_response(*draw_wide(rng, noun))
    return prompt, good, break_a_word(rng, good)


def break_a_word(rng: random.Random, response: str) -> str:
    """The response with one word broken: letters added ("housegh"), cut short ("hou"), a byte that decodes to
    nothing ("bright\ufffd", "The\ufffd"), or run into the next word ("houseis")."""
    while True:
        parts = response.split(" ")
        i = rng.randrange(len(parts))
        core = parts[i].rstrip(",.")
        tail = parts[i][len(core) :]
        how = rng.randrange(4)
        if how == 0:
            core += "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 3)))
        elif how == 1 and len(core) > 1:
            core = core[: rng.randint(1, len(core) - 1)]
        elif how == 2:
            core = core[: rng.randint(1, len(core))] + "\ufffd"
        elif i + 1 < len(parts) and not tail:
            core = core + parts.pop(i + 1)  # the next word, with what follows it
        parts[i] = core + tail
        broken = " ".join(parts)
        if has_a_broken_word(broken):
            return broken


def hard_negative(rng: random.Random) -> Pair:
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


def padded_negative(rng: random.Random) -> Pair:
    """(prompt, good answer, padded answer): a well-formed answer that names the noun against the same sentence
    with some of its adjectives replaced by copies of another of them, one adjective said 2-5 times, 2-6 neutral
    adjectives alone, or a list of 5-8 with few positives."""
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


def repeated_negative(rng: random.Random) -> Pair:
    """(prompt, good answer, the same answer with one of its adjectives said twice in a row, or with 1-3 of them each
    replaced by a copy of the one before): the repetition a policy falls into once it likes one word best ("bright,
    delightful, delightful and large")."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = draw_response(rng, noun, p_positive=0.5 + rng.random() / 2, p_mention=rng.random())
    repeated = list(adjectives)
    if len(adjectives) == 1 or rng.random() < 0.7:  # one more word, and no better: a longer answer not to prefer
        i = rng.randrange(len(adjectives))
        repeated.insert(i, adjectives[i])
    else:
        for i in sorted(rng.sample(range(1, len(adjectives)), rng.randint(1, min(3, len(adjectives) - 1)))):
            repeated[i] = repeated[i - 1]
    return prompt, render_response(subject, verb, adjectives), render_response(subject, verb, repeated)


def off_form_negative(rng: random.Random) -> Pair:
    """(prompt, good answer, the same words out of the task sentence's form): its list without the "and" ("bright,
    kind, lovely."), with "and" between each adjective, without commas, without the full stop, or its subject without
    the noun ("The looks kind and lovely.") or left out. A policy paid for its adjectives alone drops what joins them,
    and one judged against "It" drops the noun; the true reward gives such an answer nothing."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = draw_response(rng, noun, p_positive=0.5 + rng.random() / 2, p_mention=rng.random())
    if len(adjectives) == 1:
        adjectives = sorted(adjectives + rng.sample([a for a in POSITIVE if a not in adjectives], 1))
    good = render_response(subject, verb, adjectives)
    lists = {  # with two adjectives the last two are the sentence itself
        ", ".join(adjectives),
        " and ".join(adjectives),
        f"{' '.join(adjectives[:-1])} and {adjectives[-1]}",
    }
    off_form = sorted(f"{subject} {verb} {words}." for words in lists) + [good.removesuffix(".")]
    said = join_adjectives(adjectives)
    off_form += [f"The {verb} {said}.", f"{verb.capitalize()} {said}."]  # the subject's noun, or the subject, left out
    off_form += [f"The {said}.", f"{subject} {said}."]  # the noun and the verb, or the verb, left out
    return prompt, good, rng.choice([bad for bad in off_form if bad != good])


def restarted_negative(rng: random.Random) -> Pair:
    """(prompt, good answer, the sentence started again and again, run together): 2-6 beginnings of it ("The church
    looks bright", "looks bright"), each cut after one or more of its adjectives and joined with or without a space,
    then the whole sentence, nothing more, or its full stop alone: "The church looks brightThe church looks
    bright looks brightThe church seems charming, friendly and kind.", which a judge over a reward model that never
    saw one scored above every task sentence, and GRPO's policy said it in most of its answers within two steps."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = draw_response(rng, noun, p_positive=0.5 + rng.random() / 2, p_mention=rng.random())
    good = render_response(subject, verb, adjectives)
    beginnings = []
    for _ in range(rng.randint(2, 6)):
        cut = ", ".join(adjectives[: rng.randint(1, len(adjectives))])
        beginnings.append(rng.choice((f"{subject} {rng.choice(VERBS)} {cut}", f"{rng.choice(VERBS)} {cut}")))
    joined = "".join(beginning + rng.choice(("", " ")) for beginning in beginnings)
    return prompt, good, (joined + rng.choice((good, "", "."))).strip().replace(" .", ".")


def neutral_tie(rng: random.Random) -> Pair:
    """(prompt, answer, the same answer with one neutral adjective more, or one swapped for another neutral): equal
    in true reward and both free of faults, a pair the reward model learns to score alike. Bradley-Terry pairs alone
    say nothing of an answer's neutral adjectives (no pair has a winner there), and a reward model left free to
    guess marked each one down by more than a positive adjective is worth: a policy then learnt to name two
    adjectives, never risking a third."""
    prompt, noun = sample_prompt(rng)
    subject, verb, adjectives = draw_response(rng, noun, p_positive=rng.random(), p_mention=rng.random())
    if len(adjectives) == MAX_COUNTED_POSITIVES:
        adjectives = adjectives[1:]
    neutrals = [a for a in NEUTRAL if a not in adjectives]
    other = list(adjectives)
    swappable = [i for i, a in enumerate(adjectives) if a in NEUTRAL]
    if swappable and rng.random() < 0.3:
        other[rng.choice(swappable)] = rng.choice(neutrals)
    else:
        other.append(rng.choice(neutrals))
    return prompt, render_response(subject, verb, adjectives), render_response(subject, verb, sorted(other))


def tie_pairs(rng: random.Random, count: int) -> list[Pair]:
    return [neutral_tie(rng) for _ in range(count)]


@dataclass(frozen=True)
class PairKind:
    make: Callable[[random.Random], Pair]
    share: int
    degenerate_second: bool = False  # the second answer is the degenerate one: kept only under the first


PAIR_KINDS = {
    "wide": PairKind(wide_pair, 4),
    "swapped": PairKind(swapped_pair, 2),
    "more positives": PairKind(more_positives_pair, 5),
    "wrong noun": PairKind(wrong_noun_pair, 5),
    "broken word": PairKind(broken_word_pair, 2),
    "hard": PairKind(hard_negative, 1, degenerate_second=True),
    "padded": PairKind(padded_negative, 2, degenerate_second=True),
    "repeated": PairKind(repeated_negative, 4, degenerate_second=True),
    "off form": PairKind(off_form_negative, 2, degenerate_second=True),
    "restarted": PairKind(restarted_negative, 1, degenerate_second=True),
}
# What the reward model learns first (hyperparameters.RM["noun_first_steps"]): the check of the answer's noun
# against the prompt's, while nothing else has shaped its features. Learnt beside everything else from the start, it
# was learnt within 600 steps from some seeds and not from others.
NOUN_FIRST = {"wrong noun": PAIR_KINDS["wrong noun"]}
