"""`rlsteps jobs`: list submitted jobs, show one's status, print or follow its logs, cancel it. Presentation only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from rlsteps.cli import terminal

out = Console()
err = Console(stderr=True)

jobs_app = typer.Typer(
    rich_markup_mode=None,
    no_args_is_help=True,
    help="Jobs, from their first second (local runs attached or -b, Slurm, Lepton): list, status, logs, cancel.",
)

STATE_STYLES = {
    "pending": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "magenta",
    "unknown": "dim",
}
JOB_ARGUMENT = (
    "A job id (a local job's directory name, a Slurm job id, ...), its job directory's name (a unique prefix will "
    "do), or a local job's pid."
)


def _when(iso_time: str) -> str:
    """A record's ISO time to the second (records keep microseconds, for their order)."""
    return iso_time[:19].replace("T", " ")


def _state(value: str) -> Text:
    return Text(value, style=STATE_STYLES.get(value, ""))


def _address(view) -> dict | None:
    """A shared server's address file (`rlsteps serve ... -b`) while its job runs; None for a run, or a server not
    answering yet."""
    from rlsteps.launch.base import JobState
    from rlsteps.launch.shared_server import served

    return served(view.record) if view.status.state is JobState.RUNNING else None


def _serving(view) -> str | None:
    """Where a shared server answers, and the key a run names it with."""
    from rlsteps.launch.server_alloc import URL_KEYS

    found = _address(view)
    return f"{found['url']} on {found['node']}: {URL_KEYS[found['serves']]}=job:{view.record.job_id}" if found else None


def _as_dict(view) -> dict:
    found = _address(view)
    return view.as_dict() | ({"address": found["url"], "node": found["node"]} if found else {})


STATES_HELP = (
    "Only jobs in this state: pending, running, succeeded, failed, cancelled, unknown; done (succeeded), active "
    "(pending or running), ended (succeeded, failed or cancelled). Repeat for several."
)


@jobs_app.command("list")
def list_jobs(
    steps: list[str] | None = typer.Option(
        None, "--step", help="Only jobs of this step (rl/rs; a glob such as 'rl/*' for several). Repeat for several."
    ),
    states: list[str] | None = typer.Option(None, "--state", help=STATES_HELP),
    launchers: list[str] | None = typer.Option(
        None, "--launcher", help="Only jobs of this launcher: local, slurm or lepton. Repeat for several."
    ),
    since: str | None = typer.Option(
        None, "--since", help="Only jobs submitted since a time ago (30m, 6h, 2d, 1w) or a date (2026-11-25)."
    ),
    last: int | None = typer.Option(None, "--last", help="Only the N newest of the jobs the other options keep."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the jobs recorded under ./.rlsteps/jobs and under each profile's job_dir, oldest first; the options keep
    some of them (and ask only those their status)."""
    from rlsteps.plan.submitted_jobs import JobSelection
    from rlsteps.plan.submitted_jobs import list_jobs as find

    selection = JobSelection.parse(steps or (), states or (), launchers or (), since, last)
    views = find(selection=selection)
    if as_json:
        out.print_json(json.dumps([_as_dict(v) for v in views]))
        return
    if not views:
        where = "under ./.rlsteps/jobs or any profile's job_dir"
        said = f"no jobs found {where}" if selection.is_everything else f"no job found {where} matches the options"
        err.print(said, highlight=False)
        return
    terminal.print_lines(out, job_lines(views, out.width))


def job_lines(views, width: int) -> list[Text]:
    """Each job as its name (never broken) and state, then, indented, its launcher, id, step, submission and
    detail."""
    column = max(len(v.name) for v in views) + 2
    lines = terminal.heading("rlsteps jobs, oldest first", width)
    for v in views:  # its name never breaks, so it can be copied
        lines += terminal.wrap(
            Text.assemble((v.name, "bold"), " " * (column - len(v.name)), _state(v.status.state.value)),
            width,
            column,
            0,
        )
        details = f"{v.record.launcher} {v.record.job_id}, {v.record.step}, submitted {_when(v.record.submitted)}"
        details += f": {v.status.detail}" if v.status.detail else ""
        details += f"; serving at {serving}" if (serving := _serving(v)) else ""
        lines += terminal.wrap(Text(details, style="dim"), width, 4)
    return lines


@jobs_app.command("show", help="The same as status.")
@jobs_app.command("status")
def show_status(
    job: str = typer.Argument(..., help=JOB_ARGUMENT), as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Show a job's state as its launcher reports it."""
    from rlsteps.plan.submitted_jobs import JobView, find_job, job_status

    record = find_job(job)
    view = JobView(record, job_status(record))
    if as_json:
        out.print_json(json.dumps(_as_dict(view)))
        return
    rows = [
        ("job", view.name),
        ("launcher", record.launcher),
        ("id", record.job_id),
        ("step", record.step),
        ("submitted", _when(record.submitted)),
        ("job dir", record.job_dir),
        ("state", _state(view.status.state.value)),
        ("detail", view.status.detail),
        *([("serving", serving)] if (serving := _serving(view)) else []),
    ]
    terminal.print_lines(out, terminal.key_values(rows, out.width))


@jobs_app.command("logs")
def show_logs(
    job: str = typer.Argument(..., help=JOB_ARGUMENT),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines until the job ends."),
) -> None:
    """Print a job's log; with -f, follow it until the job ends (Ctrl-C stops following, the job goes on)."""
    from rlsteps.plan.submitted_jobs import find_job, job_logs

    printed = False
    for line in job_logs(find_job(job), follow=follow):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        printed = True
    if not printed:
        err.print(f"no log lines yet for {job}")


@jobs_app.command("cancel")
def cancel(job: str = typer.Argument(..., help=JOB_ARGUMENT)) -> None:
    """Cancel a job that has not ended."""
    from rlsteps.plan.submitted_jobs import cancel_job, find_job

    record = find_job(job)
    status, sent = cancel_job(record)
    name = f"{Path(record.job_dir).name} ({record.launcher} {record.job_id})"
    if not sent:
        err.print(f"{name} already ended: {status.state.value}; nothing to cancel")
        return
    terminal.print_lines(
        out,
        terminal.wrap(Text.assemble(f"{name}: ", _state(status.state.value), f"  {status.detail}"), out.width, 4, 0),
    )
    if not status.state.ended:
        err.print(f"the cancel was sent and {name} has not ended yet; `rlsteps jobs status {record.job_id}` follows it")
