"""Rich renderings of steps, dry runs and results. Presentation only."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.markup import escape
from rich.padding import Padding
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from rlsteps.catalog import Step
from rlsteps.secrets import mask_argv

if TYPE_CHECKING:
    from rlsteps.plan.runner import Compiled


def _under(text: Text | str, indent: int = 4, style: str = "") -> Padding:
    """Text indented as a whole: its wrapped lines keep the indent."""
    return Padding(text if isinstance(text, Text) else Text(text, style=style), (0, 0, 0, indent), expand=False)


def _artifacts(specs) -> str:
    """Types, '?' after one that a config may leave out."""
    return ", ".join(f"{s.type}{'' if s.required and not s.reward_source else '?'}" for s in specs)


def steps_table(steps: list[Step]) -> Group:
    """Each step as two lines that fit 80 columns: its id (never broken) and name, then what it takes and makes."""
    width = max(len(s.id) for s in steps) if steps else 0
    lines: list = [Text("rlsteps steps (? marks an input a config may leave out)", style="bold")]
    for s in steps:
        lines.append(Text.assemble((s.id.ljust(width), "bold cyan"), "  ", s.name))
        lines.append(_under(f"{_artifacts(s.consumes)} -> {_artifacts(s.produces)}", style="dim"))
    return Group(*lines)


def _requirement(spec) -> str:
    if spec.reward_source:
        unless = f", unless {spec.required_unless}" if spec.required_unless else ""
        return f"with a {spec.reward_source} reward{unless}"
    if spec.required_unless:
        return f"required unless {spec.required_unless}"
    return "required" if spec.required else "optional"


def _artifact_lines(step: Step) -> list[Text]:
    lines: list = []
    for direction, specs in (("consumes", step.consumes), ("produces", step.produces)):
        lines.append(Text(direction, style="bold"))
        for s in specs:
            kind = f"{s.type} (or as {s.type_key} says)" if s.type_key else s.type
            needed = f"  {_requirement(s)}" if direction == "consumes" else ""
            lines.append(_under(Text.assemble((s.name, "bold cyan"), f"  {kind}  at {s.key}", (needed, "yellow")), 2))
            lines.append(_under(s.description))
    return lines


def step_panel(step: Step) -> Group:
    """A step's manifest, readable at 80 columns: lines of text, no wide tables."""
    resources = ", ".join(f"{k}={v}" for k, v in step.resources.items())
    head = Panel(
        f"{step.description}\n\n[bold]algorithm[/] {step.algorithm}   [bold]configs[/] {', '.join(step.configs)}"
        f"\n[bold]tags[/] {', '.join(step.tags)}\n[bold]resources[/] {resources}",
        title=f"[bold cyan]{step.id}[/] · {step.name}",
    )
    parts: list = [head, *_artifact_lines(step)]
    if step.parameters:
        parts.append(Text("parameters (override with key=value)", style="bold"))
        for p in step.parameters:
            parts.append(_under(Text.assemble((p.name, "bold cyan"), f" = {p.default!r}"), 2))
            parts.append(_under(p.description))
    notes = [f"[bold]when[/] {s['when']}\n  [bold]then[/] {s['then']}" for s in step.strategies]
    errors = [f"[bold red]{e['name']}[/]: {e['recovery']}" for e in step.errors]
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
