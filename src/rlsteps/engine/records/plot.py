"""metrics.png: a run's main figures against step, drawn by a process of its own that starts ahead.

Most of a plot's cost is importing matplotlib (about 1.2 of the 1.7 s a plot took on two loaded cores), which a run
used to wait for at its end. So the worker starts the plotting process when it starts (`PlotProcess.start`), at the
lowest CPU priority (nice 19): it imports matplotlib on what the run leaves idle, then waits. The run cues it once
its last step's metrics are logged (`cue`), and it draws beside the last checkpoint and the output's write; `draw`
waits for the file. A run that ends any other way lets it go (`cancel`), and the process also ends by itself when
the run's process dies (its stdin closes): it never outlives the run.

    python -m rlsteps.engine.records.plot [--title=TITLE] METRICS_JSONL OUT_PNG KEY...   draws at once
    python -m rlsteps.engine.records.plot --on-cue [--title=TITLE] METRICS_JSONL OUT_PNG KEY...
                                                                  imports, then draws on 'draw'

A KEY ending in `/*` stands for every logged key under it, one level deep (`reward/*`: each reward term's mean),
when it matches two or more. Axes are plain: no offset (`+4.999`) and no scientific multiplier, and a flat series
gets a span around its value rather than ticks in its rounding noise.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

from rlsteps.contract.run_files import read_metrics
from rlsteps.engine.records.metrics import RESERVED_KEYS, metric_series

logger = logging.getLogger(__name__)
PLOT_FAILED = 2  # the command's exit code when it drew no plot (why on stderr)
CUE = "draw\n"
ON_CUE = "--on-cue"
TITLE = "--title="
PANEL_INCHES = 2.6  # the height of each figure's panel
TWO_COLUMNS_FROM = 5  # panels from which the figure has two columns
FLAT = 1e-3  # a series whose span is at most this share of its size is flat


def plot_metrics(metrics_path: Path, out_png: Path, keys: list[str], title: str | None = None) -> Path:
    """One PNG with a subplot per logged key against step, under `title`; keys never logged are skipped."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path)
    wanted = _expand(keys, {k for r in records for k in r})
    series = {key: metric_series(records, key) for key in wanted}
    missing = [key for key, (steps, _) in series.items() if not steps]
    plotted = {key: s for key, s in series.items() if s[0]}
    if not plotted:
        logged = sorted({k for r in records for k in r} - set(RESERVED_KEYS))
        raise ValueError(f"none of {keys} was logged in {metrics_path}; logged metrics: {logged}")
    if missing:
        logger.info("plot_metrics: skipped %s (never logged in %s)", missing, metrics_path)

    columns = 2 if len(plotted) >= TWO_COLUMNS_FROM else 1
    rows = -(-len(plotted) // columns)
    top = 0.3 + (0.35 if title else 0)
    height = PANEL_INCHES * rows + top - 0.3
    figure = Figure(figsize=(8 if columns == 1 else 11, height))  # fixed margins: a constrained layout measured
    FigureCanvasAgg(figure)  # every label (0.5 s)
    margins = {"left": 0.1 / columns, "right": 0.98, "top": 1 - top / height, "bottom": 0.5 / height}
    grid = figure.subplots(rows, columns, sharex=True, squeeze=False, gridspec_kw={**margins, "hspace": 0.35})
    axes = list(grid.flat)
    for ax, (key, (steps, values)) in zip(axes, plotted.items()):
        _panel(ax, key, steps, values)
    for ax in axes[len(plotted) :]:
        ax.set_visible(False)
    for ax in axes[len(plotted) - columns : len(plotted)]:
        ax.set_xlabel("step")
        ax.xaxis.set_tick_params(labelbottom=True)
    if title:
        figure.suptitle(title, fontsize=10, y=1 - 0.12 / height)
    return _save(figure, Path(out_png))


def _expand(keys: list[str], logged: set[str]) -> list[str]:
    """`keys` with each `prefix/*` replaced by the logged keys one level under it, in order, when two or more are."""
    expanded: list[str] = []
    for key in keys:
        if not key.endswith("/*"):
            expanded.append(key)
            continue
        prefix = key[:-1]
        under = sorted(k for k in logged if k.startswith(prefix) and "/" not in k[len(prefix) :])
        expanded.extend(under if len(under) >= 2 else [])
    return list(dict.fromkeys(expanded))


def _panel(ax, key: str, steps: list[int], values: list[float]) -> None:
    """One series on plain axes: integer steps, no offset or multiplier, a flat one around its value."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    ax.plot(steps, values, marker="o" if len(steps) <= 30 else None, markersize=3)
    ax.set_title(key, fontsize=10)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_scientific(False)
    ax.yaxis.set_major_formatter(formatter)
    flat = flat_span(values)
    if flat is not None:
        ax.set_ylim(*flat)


def flat_span(values: list[float]) -> tuple[float, float] | None:
    """The y-limits of a flat series (its span at most FLAT of its size): 5% of its value either side (1 when it
    is 0); None for a series that moves."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    size = max(abs(low), abs(high))
    if high - low > FLAT * size:
        return None
    centre = (low + high) / 2
    pad = 0.05 * size if size else 1.0
    return centre - pad, centre + pad


def _save(figure, out_png: Path) -> Path:
    out_png.parent.mkdir(parents=True, exist_ok=True)
    staging = out_png.with_name(f".{out_png.name}.{os.getpid()}.tmp")
    try:  # whole or not at all: a reader (or a run killed mid-draw) never meets half a PNG
        figure.savefig(staging, dpi=100, format="png")
        os.replace(staging, out_png)
    finally:
        staging.unlink(missing_ok=True)
    return out_png


class PlotProcess:
    """plot_metrics in a process of its own: `start` it ahead (it imports matplotlib and waits), `draw` once the
    metrics are complete, or `cancel`; used as a context manager, it is cancelled on the way out unless drawn."""

    def __init__(self, metrics_path: Path, out_png: Path, keys: list[str], title: str | None = None) -> None:
        self.out_png = Path(out_png)
        titled = [TITLE + title] if title else []
        self.command = [sys.executable, "-m", __name__, ON_CUE, *titled, str(metrics_path), str(out_png), *keys]
        self.process: subprocess.Popen | None = None
        self.unstartable: OSError | None = None  # why the process could not start, said by draw

    def start(self) -> None:
        """Start the process, once; never raises (a process that cannot start is said by `draw`)."""
        if self.process is not None or self.unstartable is not None:
            return
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
        try:
            self.process = subprocess.Popen(
                self.command, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        except OSError as error:
            self.unstartable = error

    def cue(self) -> None:
        """Tell the process to draw (the metrics are complete), without waiting; once. Never raises."""
        self.start()
        if self.process is None or self.process.stdin is None or self.process.stdin.closed:
            return
        try:
            self.process.stdin.write(CUE)
            self.process.stdin.close()
        except OSError:  # it has ended: draw says why
            pass

    def draw(self) -> Path:
        """The plot's path once drawn (cued now if it was not, and started if it was not); ValueError with the
        reason when it drew none."""
        self.cue()
        if self.process is None:
            raise ValueError(f"the plotting process did not start: {self.unstartable}")
        errors = self._reap()
        if self.process.returncode != 0:
            lines = [line for line in (errors or "").splitlines() if line.strip()]
            raise ValueError(lines[-1] if lines else f"the plotting process exited {self.process.returncode}")
        return self.out_png

    def cancel(self) -> None:
        """No plot: the process, when one runs, is stopped and reaped."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            self._reap()

    def _reap(self) -> str:
        """What the process said on stderr, once it has ended (stderr is its one pipe left: nothing can block)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        with self.process.stderr:
            errors = self.process.stderr.read()
        self.process.wait()
        return errors

    def __enter__(self) -> PlotProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


def _main(argv: list[str]) -> int:
    on_cue = argv[:1] == [ON_CUE]
    args = argv[1:] if on_cue else argv
    title = args[0][len(TITLE) :] if args[:1] and args[0].startswith(TITLE) else None
    args = args[1:] if title is not None else args
    if len(args) < 3:
        print(f"usage: python -m {__name__} [{ON_CUE}] [{TITLE}TITLE] METRICS_JSONL OUT_PNG KEY...", file=sys.stderr)
        return PLOT_FAILED
    try:
        if on_cue:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run decides: it cues, cancels, or its end closes stdin
            os.nice(19)  # the run's own work first
            import matplotlib.backends.backend_agg  # noqa: F401  (the cost this process is started ahead for)
            import matplotlib.figure  # noqa: F401

            if sys.stdin.readline() != CUE:
                return 0  # let go: nothing to draw
        plot_metrics(Path(args[0]), Path(args[1]), args[2:], title)
    except (ValueError, ImportError) as error:
        print(f"{error}", file=sys.stderr)
        return PLOT_FAILED
    return 0


if __name__ == "__main__":
    code = _main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # no teardown of matplotlib and numpy (0.3 s on a loaded CPU): the PNG is whole and closed
