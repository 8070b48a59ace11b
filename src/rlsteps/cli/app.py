"""The rlsteps command line: parses, calls, prints. No logic lives here."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.text import Text

from rlsteps.cli import terminal
from rlsteps.cli.artifacts import artifacts_app
from rlsteps.cli.eval import eval_app
from rlsteps.cli.jobs import jobs_app
from rlsteps.cli.pipelines import pipeline_app
from rlsteps.cli.serve import serve_app
from rlsteps.errors import ArtifactError, Interrupted, RlstepsError, UsageError

out = Console()
err = Console(stderr=True)

app = typer.Typer(
    rich_markup_mode=None,
    add_completion=False,
    no_args_is_help=True,
    help="Step-based online RL post-training: rejection sampling, REINFORCE/RLOO, GRPO-RLHF.",
)
steps_app = typer.Typer(
    rich_markup_mode=None, no_args_is_help=True, help="The step commands (the same as the top-level list/show/run)."
)
app.add_typer(steps_app, name="steps")
app.add_typer(serve_app, name="serve")
app.add_typer(jobs_app, name="jobs")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(artifacts_app, name="artifacts")
app.add_typer(eval_app, name="eval")

RUN_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": False}


def _print_version(asked: bool) -> None:
    if not asked:
        return
    from rlsteps.cli import render, terminal
    from rlsteps.install import describe, shipped_catalog

    terminal.print_lines(out, render.version_lines(describe(), shipped_catalog(), out.width))
    raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version, its source and where the catalog lies.",
    ),
) -> None:
    pass


def _catalog():
    from rlsteps.catalog import load_catalog

    return load_catalog()


def list_steps(
    consumes: str | None = typer.Option(
        None, "--consumes", metavar="TYPE", help="Only steps that consume this artifact type."
    ),
    produces: str | None = typer.Option(
        None, "--produces", metavar="TYPE", help="Only steps that produce this artifact type."
    ),
    tag: str | None = typer.Option(None, "--tag", metavar="TAG", help="Only steps with this tag."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the steps."""
    from rlsteps.cli import render, terminal

    catalog = _catalog()
    for wanted in (consumes, produces):
        if wanted is not None and wanted not in catalog.types:
            raise UsageError(
                f"unknown artifact type '{wanted}'", fix=f"known types: {', '.join(sorted(catalog.types))}"
            )
    steps = catalog.filter(consumes=consumes, produces=produces, tag=tag)
    if as_json:
        out.print_json(json.dumps([s.as_dict() for s in steps], default=str))
    else:
        terminal.print_lines(out, render.steps_table(steps, out.width))


def show_step(
    step: str = typer.Argument(..., metavar="STEP", help="A step id (rl/rs) or a unique suffix (rs)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a step: its artifacts, parameters, strategies and errors."""
    from rlsteps.cli import render, terminal

    found = _catalog().find(step)
    if as_json:
        out.print_json(json.dumps(found.as_dict(), default=str))
    else:
        terminal.print_lines(out, render.step_panel(found, out.width))


def run_step(
    ctx: typer.Context,
    step: str = typer.Argument(..., metavar="STEP", help="A step id (rl/rs) or a unique suffix (rs)."),
    overrides: list[str] | None = typer.Argument(
        None, metavar="KEY=VALUE", help="Config overrides (+key=value adds a key)."
    ),
    config: str = typer.Option(
        "default", "-c", "--config", metavar="NAME|PATH", help="A config name under steps/<step>/ or a YAML path."
    ),
    run_profile: str | None = typer.Option(
        None, "-r", "--run", metavar="PROFILE", help="Run attached on this profile."
    ),
    batch_profile: str | None = typer.Option(
        None, "-b", "--batch", metavar="PROFILE", help="Submit a detached batch job on this profile."
    ),
    dry_run: bool = typer.Option(False, "-d", "--dry-run", help="Print the merged config and the launch; do nothing."),
    force_squash: bool = typer.Option(False, "--force-squash", help="Rebuild the squashed container image."),
) -> None:
    """Run a step: here, attached (-r PROFILE) or as a batch job (-b PROFILE). Worker arguments go after --."""
    from rlsteps.cli import render, terminal
    from rlsteps.plan.runner import RunRequest, compile_request, execute

    words = list(overrides or []) + list(ctx.args)
    stray = [w for w in words if "=" not in w]
    if stray:
        raise UsageError(
            f"unexpected argument '{stray[0]}'", fix="overrides are key=value; put worker arguments after --"
        )
    request = RunRequest(
        step=step,
        config=config,
        run_profile=run_profile,
        batch_profile=batch_profile,
        dry_run=dry_run,
        force_squash=force_squash,
        overrides=tuple(words),
        passthrough=tuple((ctx.obj or {}).get("passthrough", ())),
        argv=tuple((ctx.obj or {}).get("argv", ())),
    )
    catalog = _catalog()
    compiled = compile_request(catalog, request, say=render.sayer(err))
    if dry_run:
        terminal.print_lines(out, render.dry_run(compiled, out.width))
        sys.stdout.write(render.job_files(compiled))
        if compiled.output_problem is not None:  # after everything is shown, as the run would stop on it
            raise compiled.output_problem
        refused = render.refused(compiled)
        if refused:  # after everything is shown: a script that checks with the dry run stops here
            raise ArtifactError(*refused)
        return
    submission = execute(catalog, compiled, say=render.sayer(err))
    if submission.exit_code is None:
        out.print(f"submitted job {submission.job_id} ({submission.job_dir})")


for group in (app, steps_app):
    group.command("list")(list_steps)
    group.command("show")(show_step)
    group.command("run", context_settings=RUN_CONTEXT)(run_step)


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """Arguments after the first `--` go to the worker unchanged."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def error_lines(error: RlstepsError, width: int | None) -> list[Text]:
    """`error: ...` and `fix: ...`: at a terminal each wrapped under itself; elsewhere (a log, a pipe) one line each,
    whole for grep."""
    width = width or sys.maxsize
    lines = terminal.wrap(Text.assemble(("error:", "bold red"), " ", error.message), width, 7, 0)
    return lines + (terminal.wrap(Text.assemble(("fix:", "bold"), " ", error.fix), width, 5, 0) if error.fix else [])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, passthrough = split_passthrough(argv)
    try:
        returned = app(args=args, obj={"passthrough": passthrough, "argv": ["rlsteps", *argv]}, standalone_mode=False)
    except RlstepsError as error:
        terminal.print_lines(err, error_lines(error, err.width if err.is_terminal else None))
        return error.exit_code
    except typer.Exit as done:
        return done.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        return 130
    except Exception as error:  # usage errors of the command-line parser arrive here with standalone_mode=False
        if callable(getattr(error, "show", None)) and isinstance(getattr(error, "exit_code", None), int):
            error.show()  # typer bundles its own click: match the parser's exceptions by their interface
            return 2
        raise
    if isinstance(returned, int) and returned:  # Ctrl-C inside a command: typer returns its exit code, 130
        err.print("interrupted" if returned == Interrupted.exit_code else f"exit code {returned}")
        return returned
    return 0


def entry() -> None:
    sys.exit(main())
