"""An eval report's figure, report.png: each source's greedy mean (and its other figures) for the policy and the
baseline with their intervals, and the judge's win rate, drawn as the runs' metrics.png is (matplotlib, Agg)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rlsteps.engine.eval.markdown import figure_rows

COLOURS = {"policy": "tab:blue", "baseline": "tab:gray"}


def _panels(report: dict[str, Any]) -> list[tuple[str, dict[str, dict[str, float]]]]:
    """(title, side -> estimate) for every figure with an interval, and the judge's win rates."""
    panels = []
    for name, source in report["sources"].items():
        for label, figure in _figures(name, source):
            panels.append((label, {side: figure[side] for side in COLOURS if figure.get(side)}))
    if "judge" in report:
        judge = report["judge"]
        panels.append(("judge win rate", {"policy": judge["win_rate"], "baseline": judge["baseline_win_rate"]}))
    return panels


def _figures(name: str, source: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    figures = [(f"{name} (greedy)", source.get("greedy")), (f"{name} accuracy", source.get("accuracy"))]
    figures.append((f"{name} (sampled)", source.get("sampled")))
    figures += [(f"{name} pass@{k}", e) for k, e in (source.get("pass_at_k") or {}).items()]
    return [(label, figure) for label, figure in figures if figure]


def plot_report(report: dict[str, Any], out_png: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = _panels(report) or [("no figures", {})]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4 * cols, 3 * rows), dpi=100)
    FigureCanvasAgg(fig)
    for i, (title, sides) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        names = list(sides)
        means = [sides[s]["mean"] for s in names]
        errors = [
            [m - sides[s]["low"] for s, m in zip(names, means)],
            [sides[s]["high"] - m for s, m in zip(names, means)],
        ]
        ax.bar(names, means, yerr=errors, capsize=6, color=[COLOURS[s] for s in names])
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"eval: {len(figure_rows(report))} figures over {report['prompts']} prompts", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png)
    return out_png
