"""The judge protocol: which responses are compared, the chat request that asks for a comparison, and the
shape of the judge's answer.

Semantics of NeMo-Gym's genrm_compare: the responses of a prompt are compared in pairs ((i, i+1 mod N) or
all pairs); the judge answers {"score_1": 1-5, "score_2": 1-5, "ranking": 1-6}.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations

SYSTEM_PROMPT = """You are an impartial judge. Compare two responses to the same conversation.
{principle}Rate each response for helpfulness on a scale of 1 (very poor) to 5 (excellent), then rank them:
1 = Response 1 is much better, 2 = better, 3 = slightly better,
4 = Response 2 is slightly better, 5 = better, 6 = much better.
Answer ONLY with a JSON object in a ```json fenced block, exactly:
```json
{{"score_1": <1-5>, "score_2": <1-5>, "ranking": <1-6>}}
```"""

SECTION_MARKERS = ("[PROMPT]", "[/PROMPT]", "[RESPONSE 1]", "[/RESPONSE 1]", "[RESPONSE 2]", "[/RESPONSE 2]")

_REQUEST_PATTERN = re.compile(
    r"\A\[PROMPT\]\n(?P<prompt>.*)\n\[/PROMPT\]\n\n"
    r"\[RESPONSE 1\]\n(?P<response_1>.*)\n\[/RESPONSE 1\]\n\n"
    r"\[RESPONSE 2\]\n(?P<response_2>.*)\n\[/RESPONSE 2\]\Z",
    re.DOTALL,
)


@dataclass(frozen=True)
class Judgement:
    score_1: float  # 1-5
    score_2: float  # 1-5
    ranking: float  # 1 = response 1 much better ... 6 = response 2 much better


def comparison_pairs(n: int, mode: str) -> list[tuple[int, int]]:
    """Which responses of a group of n are compared: "circular" (i, i+1 mod n) or "all" pairs."""
    if mode == "all":
        return list(combinations(range(n), 2))
    if mode == "circular":
        if n < 2:
            return []
        return [(0, 1)] if n == 2 else [(i, (i + 1) % n) for i in range(n)]
    raise ValueError(f"unknown pairing {mode!r}: use 'circular' or 'all'")


def judge_messages(prompt: str, response_1: str, response_2: str, principle: str | None) -> list[dict]:
    """The chat request that asks the judge to compare two responses to `prompt`."""
    principle_line = f"Judge by this principle: {principle}\n" if principle else ""
    user = (
        f"[PROMPT]\n{prompt}\n[/PROMPT]\n\n"
        f"[RESPONSE 1]\n{response_1}\n[/RESPONSE 1]\n\n"
        f"[RESPONSE 2]\n{response_2}\n[/RESPONSE 2]"
    )
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(principle=principle_line)},
        {"role": "user", "content": user},
    ]


def parse_judge_request(messages: list[dict]) -> tuple[str, str, str]:
    """(prompt, response_1, response_2) from messages built by judge_messages().

    Raises ValueError naming what is missing when the request was not built that way.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("'messages' must be a list of {role, content} objects")
    users = [m for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)]
    if not users:
        raise ValueError("the request has no user message with text content")
    match = _REQUEST_PATTERN.match(users[-1]["content"])
    if match is None:
        raise ValueError(
            "the user message is not a judge request: it must hold the sections "
            + ", ".join(SECTION_MARKERS)
            + " in order, as rlsteps.engine.rewards.judge.protocol.judge_messages() writes them"
        )
    return match["prompt"], match["response_1"], match["response_2"]
