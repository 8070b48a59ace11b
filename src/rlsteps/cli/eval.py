"""`rlsteps eval`: evaluation reports (eval/policy's eval_report) side by side. Presentation only: a report is the
JSON its step wrote."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from rlsteps.errors import ArtifactError

out = Console()
eval_app = typer.Typer(
    rich_markup_mode=None,
    no_args_is_help=True,
    help="Evaluation reports (rlsteps run eval/policy): compare two side by side.",
)
REPORT_HELP = "A report: its folder (<output.dir>/report), the run directory holding it, or its report.json."


def load_report(where: str) -> dict[str, Any]:
    """The report.json at, in or under `where`; exit 3 with the fix when there is none."""
    path = Path(where)
    for candidate in (path, path / "report.json", path / "report" / "report.json"):
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text())
            except ValueError as error:
                raise ArtifactError(f"{candidate} is no eval report ({error})") from None
    raise ArtifactError(
        f"no eval report at {where}", fix="name a report folder (<output.dir>/report) written by eval/policy"
    )


def report_figures(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """figure name -> the policy's estimate (mean, low, high), for every figure of the report."""
    figures = {}
    for name, source in report.get("sources", {}).items():
        for label, figure in (("greedy mean", "greedy"), ("accuracy", "accuracy"), ("sampled mean", "sampled")):
            if source.get(figure):
                figures[f"{name} {label}"] = source[figure]["policy"]
        for k, estimate in (source.get("pass_at_k") or {}).items():
            figures[f"{name} pass@{k}"] = estimate["policy"]
        difference = (source.get("greedy") or {}).get("difference")
        if difference:
            figures[f"{name} gain over baseline"] = difference
    if "judge" in report:
        figures["judge win rate over baseline"] = report["judge"]["win_rate"]
    return figures


def _cell(estimate: dict[str, float] | None) -> str:
    if not estimate or estimate.get("mean") is None or math.isnan(estimate["mean"]):
        return "-"
    return f"{estimate['mean']:.3f} [{estimate['low']:.3f}, {estimate['high']:.3f}]"


def _delta(a: dict[str, float] | None, b: dict[str, float] | None) -> str:
    if not a or not b or math.isnan(a["mean"]) or math.isnan(b["mean"]):
        return "-"
    return f"{b['mean'] - a['mean']:+.3f}"


@eval_app.command("compare")
def compare(
    a: str = typer.Argument(..., help=REPORT_HELP),
    b: str = typer.Argument(..., help=REPORT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: figure -> {a, b}."),
) -> None:
    """Two reports side by side: each figure's mean and interval in A and in B, and B - A."""
    first, second = report_figures(load_report(a)), report_figures(load_report(b))
    names = list(dict.fromkeys([*first, *second]))
    if as_json:
        out.print_json(json.dumps({n: {"a": first.get(n), "b": second.get(n)} for n in names}))
        return
    from rlsteps.cli import render, terminal

    rows = [(n, _cell(first.get(n)), _cell(second.get(n)), _delta(first.get(n), second.get(n))) for n in names]
    terminal.print_lines(out, render.comparison(rows, a, b, out.width))
