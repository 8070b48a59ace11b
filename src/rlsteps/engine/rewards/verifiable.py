"""Reward functions for prompts with a known short answer (the `verifiable` example's configs).

A prompt line such as {"id": ..., "messages": [...], "answer": "Paris"} passes its `answer` to these functions by
keyword; `answer` may also be a list of accepted answers ("gray" or "grey").

exact_match(messages, response, answer) -> 1.0 when the response, normalised, is an accepted answer, else 0.0.
Normalising forgives only what a reader would not call a different answer:

    - letter case and surrounding whitespace ("  paris " is "Paris"; inner runs of whitespace count as one space)
    - markdown emphasis and quotes around the whole answer (**Paris**, "Paris", `Paris`)
    - punctuation at the end (Paris. / Paris! / 12.)

Nothing else: "The answer is Paris.", "Paris, of course" or "Paris\n\nParis is the capital..." score 0. Teaching the
policy to say the answer alone, as the prompt asks, is part of what the reward asks of it.

one_word(messages, response) -> 1.0 when the normalised response is a single word (letters, digits, an apostrophe or
a hyphen inside): the format alone, right or wrong; a validation metric beside exact_match.

A missing answer (no `answer` key on the prompt line) gives None: no reward for that sample.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_WRAPPERS = "*_`\"'“”‘’"
_TRAILING = ".!?,;:。"
_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")


def normalise(text: str) -> str:
    """Case-folded, whitespace collapsed, wrapping emphasis or quotes and trailing punctuation removed."""
    text = " ".join(text.split()).casefold()
    previous = None
    while text != previous:
        previous = text
        text = text.rstrip(_TRAILING).strip()
        if len(text) >= 2 and text[0] in _WRAPPERS and text[-1] == _matching(text[0]):
            text = text.strip(text[0] + _matching(text[0])).strip()
    return text


def _matching(opening: str) -> str:
    return {"“": "”", "‘": "’"}.get(opening, opening)


def _accepted(answer: Any) -> list[str]:
    answers = [answer] if isinstance(answer, str | int | float) else list(answer)
    return [normalise(str(item)) for item in answers]


def exact_match(messages: Sequence[dict], response: str, answer: Any = None) -> float | None:
    """1.0 when the normalised response is one of the accepted answers, else 0.0; None without an answer."""
    if answer is None:
        return None
    return 1.0 if normalise(response) in _accepted(answer) else 0.0


def one_word(messages: Sequence[dict], response: str) -> float:
    """1.0 when the normalised response is a single word, else 0.0."""
    return 1.0 if _WORD.fullmatch(normalise(response)) else 0.0
