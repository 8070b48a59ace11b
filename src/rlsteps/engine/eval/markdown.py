"""An eval report as a short markdown table: a row per figure, the policy, the baseline and their difference, each
with its interval."""

from __future__ import annotations

import math
from typing import Any


def interval(estimate: dict[str, float] | None) -> str:
    """0.512 [0.431, 0.598] (n=64); an em dash where there is none."""
    if not estimate or not estimate.get("n") or math.isnan(estimate["mean"]):
        return "—"
    return f"{estimate['mean']:.3f} [{estimate['low']:.3f}, {estimate['high']:.3f}]"


def figure_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, policy, baseline, policy - baseline) for every figure of every source."""
    rows = []
    for name, source in report["sources"].items():
        greedy = source.get("greedy")
        if greedy:
            rows.append((f"{name} (greedy mean)", *_sides(greedy), _difference(greedy.get("difference"))))
        if "accuracy" in source:
            rows.append((f"{name} accuracy (greedy)", *_sides(source["accuracy"]), ""))
        if "sampled" in source:
            rows.append((f"{name} (sampled mean)", *_sides(source["sampled"]), ""))
        for k, estimate in (source.get("pass_at_k") or {}).items():
            rows.append((f"{name} pass@{k}", *_sides(estimate), ""))
    return rows


def _sides(figure: dict[str, Any]) -> tuple[str, str]:
    return interval(figure.get("policy")), interval(figure.get("baseline"))


def _difference(difference: dict[str, Any] | None) -> str:
    if not difference:
        return ""
    counts = f"{difference['gains']} gains, {difference['losses']} losses, sign test p={difference['sign_test_p']:.3g}"
    return f"{interval(difference)}; {counts}"


def judge_lines(judge: dict[str, Any]) -> list[str]:
    return [
        f"- win rate of the policy over the baseline: {interval(judge['win_rate'])} "
        f"({judge['wins']} wins, {judge['losses']} losses, {judge['ties']} ties, {judge['failed']} failed; "
        f"sign test p={judge['sign_test_p']:.3g})",
        f"- win rate of the baseline over the policy: {interval(judge['baseline_win_rate'])}",
        f"- by the side shown first: policy first {interval(judge['win_rate_policy_shown_first'])}, "
        f"policy second {interval(judge['win_rate_policy_shown_second'])}",
        f"- the response shown first won {_rate(judge['first_position_rate'])} of {judge['verdicts']} verdicts; "
        f"{_rate(judge['contradiction_rate'])} contradicted themselves",
    ]


def _rate(value: float) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.2f}"


def report_markdown(report: dict[str, Any]) -> str:
    settings = report["settings"]
    confidence = f"{settings['confidence']:.0%}"
    lines = [
        f"# Evaluation: {report['inputs'].get('policy')}",
        "",
        f"{report['prompts']} prompts; baseline {report['inputs'].get('baseline', '—')}; means with {confidence} "
        f"bootstrap intervals ({settings['bootstrap_resamples']} resamples over prompts).",
        "",
        "| figure | policy | baseline | policy − baseline |",
        "|---|---|---|---|",
        *(f"| {' | '.join(row)} |" for row in figure_rows(report)),
    ]
    if "judge" in report:
        lines += ["", "Judge (each pair shown both ways round):", "", *judge_lines(report["judge"])]
    return "\n".join(lines) + "\n"
