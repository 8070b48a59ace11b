"""`rlsteps pipeline run`: chain steps through their artifacts. Presentation only."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

out = Console()
err = Console(stderr=True)

pipeline_app = typer.Typer(
    rich_markup_mode=None, no_args_is_help=True, help="Pipelines: stages of steps bound by their artifacts."
)


@pipeline_app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def run_pipeline(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="A pipeline YAML file, or a shipped example's name (rlsteps pipeline list)."),
    overrides: list[str] | None = typer.Argument(None, help="key=value for every stage, STAGE:key=value for one."),
    run_profile: str | None = typer.Option(None, "-r", "--run", help="Run each stage attached on this profile."),
    batch_profile: str | None = typer.Option(
        None, "-b", "--batch", help="Submit the stages as dependent batch jobs (Slurm)."
    ),
    dry_run: bool = typer.Option(
        False, "-d", "--dry-run", help="Show each stage, its inputs and whether it would run."
    ),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: print JSON."),
) -> None:
    """Run a pipeline's stages in order; unchanged finished stages are skipped, a failed one resumes on rerun."""
    from rlsteps.catalog import load_catalog
    from rlsteps.errors import UsageError
    from rlsteps.plan import pipeline
    from rlsteps.plan.chain import previous_chain

    if run_profile and batch_profile:
        raise UsageError(
            "-r and -b are exclusive", fix="use -r PROFILE to run attached or -b PROFILE to submit batch jobs"
        )
    words = list(overrides or []) + list(ctx.args)
    stray = [w for w in words if "=" not in w]
    if stray:
        raise UsageError(f"unexpected argument '{stray[0]}'", fix="overrides are key=value or STAGE:key=value")
    request = pipeline.PipelineRequest(
        path=path,
        run_profile=run_profile,
        batch_profile=batch_profile,
        overrides=tuple(words),
        argv=tuple((ctx.obj or {}).get("argv", ())),
    )
    catalog = load_catalog()
    if dry_run:
        spec = pipeline.load_pipeline(path)
        notes, live = previous_chain(spec.name)
        from rlsteps.cli import render

        for line in notes:
            render.sayer(err)(line)
        if live is not None:
            from rlsteps.cli import terminal

            said = f" {live.message}; running it now is refused (fix: {live.fix or ''})"
            terminal.print_lines(err, terminal.wrap(Text.assemble(("warning:", "bold yellow"), said), err.width, 9, 0))
        rows = pipeline.describe(pipeline.plan_pipeline(catalog, spec, request))
        if as_json:
            out.print_json(json.dumps(rows))
        else:
            _print_stages(rows)
        return
    from rlsteps.cli import render, terminal

    outcomes = pipeline.run_pipeline(catalog, request, say=render.sayer(err))
    for o in outcomes:
        said = f"{o.name}: {o.action}" + (f" (job {o.job_id})" if o.job_id else "")
        said += f" ({o.detail})" if o.detail else ""
        terminal.print_lines(out, terminal.wrap(said, out.width, 4, 0))


def _print_stages(rows: list[dict]) -> None:
    from rlsteps.cli import terminal

    width = out.width
    lines = terminal.heading("pipeline dry run: nothing is started", width)
    for r in rows:
        lines += terminal.wrap(
            Text.assemble((f"stage {r['stage']}", "bold"), f": {r['action']} ({r['why']})"), width, 4, 0
        )
        lines += terminal.wrap(f"{r['step']} -c {r['config']} " + " ".join(r["overrides"]), width, 6, 2)
        lines += [
            line for name, value in r["inputs"].items() for line in terminal.wrap(f"in  {name}: {value}", width, 6, 2)
        ]
        for name, value in r["outputs"].items():
            published = f", published as {r['publish']}" if r["publish"] else ""
            lines += terminal.wrap(f"out {name}: {value}{published}", width, 6, 2)
        after = f", after {', '.join(r['after'])}" if r["after"] else ""
        lines += terminal.wrap(f"launch: {r['launch']}{after}", width, 6, 2)
    terminal.print_lines(out, lines)


@pipeline_app.command("list")
def list_pipelines() -> None:
    """List the example pipelines rlsteps ships: `rlsteps pipeline run NAME` runs one from any folder."""
    from rlsteps.cli import terminal
    from rlsteps.plan import pipeline

    shipped = pipeline.shipped_pipelines()
    lines = terminal.heading("example pipelines", out.width)
    lines += terminal.wrap("run one: rlsteps pipeline run NAME", out.width, 4, 2)
    lines += terminal.wrap("copy one to change: rlsteps pipeline show NAME > mine.yaml", out.width, 4, 2)
    for name, path in shipped.items():
        chain = " -> ".join(f"{s.name} ({s.step})" for s in pipeline.load_pipeline(path).stages)
        lines += terminal.wrap(Text.assemble((name, "bold"), f": {chain}"), out.width, 4, 0)
    folder = next(iter(shipped.values())).parent if shipped else "nowhere: this install ships no catalog"
    lines += terminal.wrap(f"from {folder}", out.width, 4, 0)
    terminal.print_lines(out, lines)


@pipeline_app.command("show")
def show_pipeline(
    path: Path = typer.Argument(..., help="A pipeline YAML file, or a shipped example's name."),
) -> None:
    """Print a pipeline file as it is (a shipped example, to copy and change)."""
    from rlsteps.plan import pipeline

    found = pipeline.find_pipeline(path)
    print(found.read_text(), end="")
