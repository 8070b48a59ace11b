"""Rich renderings of steps, dry runs and results. Presentation only."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from rlsteps.catalog import Step
from rlsteps.secrets import mask_argv

if TYPE_CHECKING:
    from rlsteps.plan.runner import Compiled


def _artifacts(step: Step, which: str) -> str:
    specs = step.consumes if which == "consumes" else step.produces
    return "\n".join(f"{s.type}{'' if s.required or which == 'produces' else '?'}" for s in specs)


def steps_table(steps: list[Step]) -> Table:
    table = Table(title="rlsteps steps", show_lines=False, header_style="bold")
    for column in ("id", "name", "consumes", "produces", "tags"):
        table.add_column(column, overflow="fold")
    for s in steps:
        table.add_row(
            Text(s.id, style="bold cyan"),
            s.name,
            _artifacts(s, "consumes"),
            _artifacts(s, "produces"),
            ", ".join(s.tags),
        )
    return table


def step_panel(step: Step) -> Group:
    io = Table(header_style="bold", title="artifacts")
    for column in ("direction", "name", "type", "config key", "required", "description"):
        io.add_column(column, overflow="fold")
    for direction, specs in (("consumes", step.consumes), ("produces", step.produces)):
        for s in specs:
            required = "yes" if s.required else f"unless {s.required_unless}" if s.required_unless else "no"
            if s.reward_source:
                required = f"with a {s.reward_source} reward"
            kind = f"{s.type} (or as {s.type_key} says)" if s.type_key else s.type
            io.add_row(direction, s.name, kind, s.key, required if direction == "consumes" else "", s.description)
    params = Table(header_style="bold", title="parameters (override with key=value)")
    for column in ("name", "default", "description"):
        params.add_column(column, overflow="fold")
    for p in step.parameters:
        params.add_row(p.name, repr(p.default), p.description)
    notes = [f"[bold]when[/] {s['when']}\n  [bold]then[/] {s['then']}" for s in step.strategies]
    errors = [f"[bold red]{e['name']}[/]: {e['recovery']}" for e in step.errors]
    resources = ", ".join(f"{k}={v}" for k, v in step.resources.items())
    head = Panel(
        f"{step.description}\n\n[bold]algorithm[/] {step.algorithm}   [bold]configs[/] {', '.join(step.configs)}"
        f"   [bold]tags[/] {', '.join(step.tags)}\n[bold]resources[/] {resources}",
        title=f"[bold cyan]{step.id}[/] · {step.name}",
    )
    parts = [head, io, params]
    if notes:
        parts.append(Panel("\n".join(notes), title="strategies"))
    if errors:
        parts.append(Panel("\n".join(errors), title="errors and recovery"))
    return Group(*parts)


def dry_run(compiled: Compiled) -> Group:
    from omegaconf import OmegaConf

    job, plan = compiled.job, compiled.plan
    where = f"profile {job.profile_name} ({job.profile_source})" if job.profile_name else "this machine"
    summary = Table.grid(padding=(0, 2))
    for key, value in (
        ("step", f"{job.step_id} (algorithm {job.algorithm})"),
        ("config", f"{job.config_name} ({job.config_source})"),
        ("mode", f"{job.mode} on {where}, executor {job.executor}"),
        ("job dir", f"{compiled.job_dir} (not created: dry run)"),
        ("overrides", " ".join(mask_argv(job.overrides)) or "none"),
        ("passthrough", " ".join(mask_argv(job.passthrough)) or "none"),
        ("launch", plan.summary),
    ):
        summary.add_row(Text(key, style="bold"), value)
    inputs = Table(header_style="bold", title="input artifacts")
    for column in ("name", "key", "reference", "required type", "status"):
        inputs.add_column(column, overflow="fold")
    for item in compiled.inputs:
        status = {
            "ok": "[green]ok[/]",
            "absent": "not set",
            "pending": "[cyan]written before the run[/]",
            "missing": "[yellow]missing[/]",
            "wrong_type": "[red]wrong type[/]",
            "malformed": "[red]malformed[/]",
            "in_job": "[cyan]on a cluster path: checked in the job[/]",
            "unreachable": "[red]on this machine: the job cannot see it[/]",
            "hub": "[cyan]a Hugging Face Hub id: fetched where the run starts[/]",
        }[item.status]
        inputs.add_row(item.name, item.key, item.ref or "-", item.required_type, status)
    parts = [Panel(summary, title="[bold]dry run[/]: nothing was written, started or sent")]
    if job.notes:
        parts.append(Panel("\n".join(escape(note) for note in job.notes), title="notes"))
    if compiled.needs:
        parts.append(Panel("\n".join(compiled.needs), title="[yellow]the run will need[/] (required, not given yet)"))
    parts += [
        inputs,
        Panel(Syntax(shlex.join(mask_argv(plan.command)), "bash", word_wrap=True), title="command"),
    ]
    if plan.env:
        parts.append(Panel("\n".join(f"{k}={v}" for k, v in plan.env.items()), title="environment"))
    if job.profile_name:
        parts.append(
            Panel(Syntax(OmegaConf.to_yaml(OmegaConf.create(job.public_launcher_settings())), "yaml"), title="profile")
        )
    parts.append(Panel(Syntax(OmegaConf.to_yaml(OmegaConf.create(job.public_config())), "yaml"), title="merged config"))
    return Group(*parts)


def refused(compiled: Compiled) -> tuple[str, str] | None:
    """The dry run's last word when the run would stop on inputs it was given: one line naming each (the table above
    has them too), and one line with each fix; None when there is none."""
    if not compiled.refused:
        return None
    count = len(compiled.refused)
    message = f"the run would refuse {count} input{'s' if count > 1 else ''}: " + "; ".join(
        error.message for error in compiled.refused
    )
    return message, "; ".join(error.fix for error in compiled.refused if error.fix)


def job_files(compiled: Compiled) -> str:
    """The files the job directory will hold, verbatim between header lines: no wrapping, no frame, so a script
    can be copied from a terminal or a pipe as it is."""
    blocks = [
        f"----- {name} (written into the job dir) -----\n{content.rstrip()}\n"
        for name, content in compiled.plan.files.items()
    ]
    return "\n".join(blocks)


def sayer(console: Console):
    """How the CLI says a progress line: one line, never wrapped (an id or path stays whole when piped)."""

    def say(line: str) -> None:
        console.print(f"[bold]rlsteps[/] {escape(line)}", highlight=False, soft_wrap=True)

    return say
