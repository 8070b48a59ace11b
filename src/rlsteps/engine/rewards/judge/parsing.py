"""Reading a judgement out of a judge's free-text answer: a fenced ```json block first, else the last {...}."""

from __future__ import annotations

import json
import re

from rlsteps.engine.rewards.judge.protocol import Judgement

_FENCED_JSON = re.compile(r"```(?:json)?[ \t]*\n?(.*?)```", re.DOTALL | re.IGNORECASE)


class JudgeParseError(ValueError):
    """The judge's answer holds no valid {score_1, score_2, ranking} object."""


def parse_judgement(text: str) -> Judgement:
    """The judgement in a judge's answer: a fenced ```json block first, else the last {...} that parses."""
    if not isinstance(text, str) or not text.strip():
        raise JudgeParseError("the judge answered with empty content")
    fenced = [obj for block in _FENCED_JSON.findall(text) for obj in _json_objects(block)]
    fields = _last_judgement_fields(fenced) or _last_judgement_fields(_json_objects(text))
    if fields is None:
        cause = "no JSON object with score_1, score_2 and ranking" if "{" in text else "no JSON object"
        raise JudgeParseError(f"{cause} in the judge's answer: {shorten(text)!r}")
    values, quoted = {}, repr(shorten(text))
    for key, high in (("score_1", 5), ("score_2", 5), ("ranking", 6)):
        try:
            values[key] = _number(fields[key])
        except (TypeError, ValueError):
            raise JudgeParseError(f"{key}={fields[key]!r} is not a number in the judge's answer: {quoted}") from None
        if not 1 <= values[key] <= high:
            raise JudgeParseError(f"{key}={values[key]:g} is outside 1-{high} in the judge's answer: {quoted}")
    return Judgement(**values)


def _json_objects(text: str) -> list[dict]:
    """Every outermost {...} of `text` that parses as a JSON object, in order."""
    decoder, objects, start = json.JSONDecoder(), [], text.find("{")
    while start != -1:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            objects.append(obj)
        start = text.find("{", end)
    return objects


def _last_judgement_fields(objects: list[dict]) -> dict | None:
    """The last object holding the three fields, itself or in a nested "overall" object."""
    keys = ("score_1", "score_2", "ranking")
    holders = [h for obj in objects for h in (obj, obj.get("overall")) if isinstance(h, dict)]
    return next((h for h in reversed(holders) if all(k in h for k in keys)), None)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(value)
    return float(value)


def shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[: limit // 2]} ... {text[-limit // 2 :]}"
