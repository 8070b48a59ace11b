"""The one definition of the text a scalar reward model scores, and of the part of it that is kept.

The reward model is trained on exactly this string (see rlsteps.tiny) and served on it
(see scorer.py), so training and serving can never tokenise differently.
"""

from typing import Literal

TruncationSide = Literal["left", "right"]
TRUNCATION_SIDES: tuple[TruncationSide, ...] = ("left", "right")


def reward_input_text(prompt: str, response: str, eos_token: str | None) -> str:
    """The rendered prompt the policy saw, its decoded response, and the reward tokenizer's EOS."""
    return f"{prompt}{response}{eos_token or ''}"


def truncate(ids: list[int], max_length: int, side: TruncationSide) -> list[int]:
    """At most `max_length` token ids: "left" drops the start (keeps the end: the response and its EOS, where the
    reward is read), "right" drops the end."""
    if side not in TRUNCATION_SIDES:
        raise ValueError(f"truncation side must be left or right, got {side!r}")
    if len(ids) <= max_length:
        return ids
    return ids[-max_length:] if side == "left" else ids[:max_length]
