"""The judge protocol: which responses are compared, the chat request that asks for a comparison, the
structured-output schema of the answer, and the shape of the judge's answer.

Semantics of NeMo-Gym's genrm_compare: the responses of a prompt are compared in pairs ((i, i+1 mod N) or
all pairs); the judge answers {"score_1": 1-5, "score_2": 1-5, "ranking": 1-6}. Unlike genrm_compare, each pair
can be shown in both orders (the default of judge.both_orders), so that the response shown first is not favoured.

The judge sees the conversation as the prompt file holds it (its own messages, or its raw text as one user
message), transcribed into plain role-tagged sections of one user message. It never sees the policy's chat
template markup: a judge with its own template would read a second conversation inside the first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations

SYSTEM_PROMPT = """You are an impartial judge. Compare two responses to the same conversation.
{principle}Rate each response for helpfulness on a scale of 1 (very poor) to 5 (excellent), then rank them:
1 = Response 1 is much better, 2 = better, 3 = slightly better,
4 = Response 2 is slightly better, 5 = better, 6 = much better.
Answer with only a JSON object, exactly:
{{"score_1": <1-5>, "score_2": <1-5>, "ranking": <1-6>}}"""

ROLES = ("system", "user", "assistant")
SECTION_MARKERS = (
    "[CONVERSATION]", "[/CONVERSATION]", "[RESPONSE 1]", "[/RESPONSE 1]", "[RESPONSE 2]", "[/RESPONSE 2]",
)  # fmt: skip

JUDGEMENT_SCHEMA = {
    "type": "object",
    "properties": {
        "score_1": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
        "score_2": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
        "ranking": {"type": "integer", "enum": [1, 2, 3, 4, 5, 6]},
    },
    "required": ["score_1", "score_2", "ranking"],
    "additionalProperties": False,
}
RESPONSE_FORMATS = {  # judge.structured_output -> the request's response_format (OpenAI chat completions)
    "json_schema": {"type": "json_schema", "json_schema": {"name": "judgement", "schema": JUDGEMENT_SCHEMA}},
    "json_object": {"type": "json_object"},
    "none": None,
}

_REQUEST_PATTERN = re.compile(
    r"\A\[CONVERSATION\]\n(?P<conversation>.*)\n\[/CONVERSATION\]\n\n"
    r"\[RESPONSE 1\]\n(?P<response_1>.*)\n\[/RESPONSE 1\]\n\n"
    r"\[RESPONSE 2\]\n(?P<response_2>.*)\n\[/RESPONSE 2\]\Z",
    re.DOTALL,
)
_TURN_PATTERN = re.compile(r"\[(SYSTEM|USER|ASSISTANT)\]\n(.*?)\n\[/\1\]", re.DOTALL)


@dataclass(frozen=True)
class Judgement:
    score_1: float  # 1-5
    score_2: float  # 1-5
    ranking: float  # 1 = response 1 much better ... 6 = response 2 much better


@dataclass(frozen=True)
class JudgeRequest:
    conversation: list[dict[str, str]]  # chat messages: {"role", "content"}
    response_1: str
    response_2: str


def comparison_pairs(n: int, mode: str, both_orders: bool = False) -> list[tuple[int, int]]:
    """Which responses of a group of n are compared, first shown first: "circular" (i, i+1 mod n) or "all" pairs;
    with both_orders, each pair is followed by the same pair the other way round."""
    if mode == "all":
        pairs = list(combinations(range(n), 2))
    elif mode == "circular":
        pairs = [] if n < 2 else [(0, 1)] if n == 2 else [(i, (i + 1) % n) for i in range(n)]
    else:
        raise ValueError(f"unknown pairing {mode!r}: use 'circular' or 'all'")
    return [shown for i, j in pairs for shown in ((i, j), (j, i))] if both_orders else pairs


def transcript(conversation: list[dict[str, str]]) -> str:
    """The conversation as role-tagged plain text: [USER]\\n...\\n[/USER], one block per message."""
    for message in conversation:
        if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise ValueError(f"a conversation message needs a role in {ROLES} and text content, got {message!r}")
    return "\n".join(f"[{m['role'].upper()}]\n{m['content']}\n[/{m['role'].upper()}]" for m in conversation)


def judge_messages(
    conversation: list[dict[str, str]], response_1: str, response_2: str, principle: str | None
) -> list[dict]:
    """The chat request that asks the judge to compare two responses to `conversation`."""
    principle_line = f"Judge by this principle: {principle}\n" if principle else ""
    user = (
        f"[CONVERSATION]\n{transcript(conversation)}\n[/CONVERSATION]\n\n"
        f"[RESPONSE 1]\n{response_1}\n[/RESPONSE 1]\n\n"
        f"[RESPONSE 2]\n{response_2}\n[/RESPONSE 2]"
    )
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(principle=principle_line)},
        {"role": "user", "content": user},
    ]


def parse_judge_request(messages: list[dict]) -> JudgeRequest:
    """The conversation and the two responses of messages built by judge_messages().

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
    turns = [{"role": role.lower(), "content": text} for role, text in _TURN_PATTERN.findall(match["conversation"])]
    if not turns:
        raise ValueError("the [CONVERSATION] section holds no [USER], [SYSTEM] or [ASSISTANT] message")
    return JudgeRequest(turns, match["response_1"], match["response_2"])
