"""Steps, a step, dry runs and the version as lines that fit the terminal (cli.terminal). Presentation only."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from rlsteps.catalog import Step
from rlsteps.cli import terminal
from rlsteps.secrets import mask_argv

if TYPE_CHECKING:
    from rlsteps.plan.runner import Compiled


SCRIPT_MARK = "\n"  # a command word of several lines is a script: shown by itself, verbatim
SCRIPT_WORD = "SCRIPT"
STATUS_WORDS = {
    "ok": ("ok", "green"),
    "absent": ("not set", ""),
    "pending": ("written before the run", "cyan"),
    "missing": ("missing", "yellow"),
    "wrong_type": ("wrong type", "red"),
    "malformed": ("malformed", "red"),
    "in_job": ("on a cluster path: checked in the job", "cyan"),
    "unreachable": ("on this machine: the job cannot see it", "red"),
    "hub": ("a Hugging Face Hub id: fetched where the run starts", "cyan"),
}


def _artifacts(specs) -> str:
    """Types, '?' after one that a config may leave out."""
    return ", ".join(f"{s.type}{'' if s.required and not s.reward_source else '?'}" for s in specs)


def version_lines(described: str, catalog: Path | None, width: int) -> list[Text]:
    where = str(catalog) if catalog else "none found"
    return terminal.wrap(described, width, 2, 0) + terminal.wrap(
        f"catalog (steps, manifests, profiles, pipelines): {where}", width, 2, 0
    )


def steps_table(steps: list[Step], width: int) -> list[Text]:
    """Each step as an id (never broken) and its name, then, indented, what it takes and makes."""
    column = max((len(s.id) for s in steps), default=0) + 2
    lines = terminal.heading("rlsteps steps (? marks an input a config may leave out)", width)
    for s in steps:
        lines += terminal.wrap(Text.assemble((s.id, "bold cyan"), " " * (column - len(s.id)), s.name), width, column, 0)
        lines += terminal.wrap(Text(f"{_artifacts(s.consumes)} -> {_artifacts(s.produces)}", style="dim"), width, 4)
    return lines


def _requirement(spec) -> str:
    if spec.reward_source:
        unless = f", unless {spec.required_unless}" if spec.required_unless else ""
        return f"with a {spec.reward_source} reward{unless}"
    if spec.required_unless:
        return f"required unless {spec.required_unless}"
    return "required" if spec.required else "optional"


def _artifact_lines(step: Step, width: int) -> list[Text]:
    lines: list[Text] = []
    for direction, specs in (("consumes", step.consumes), ("produces", step.produces)):
        lines += terminal.heading(direction, width)
        for s in specs:
            kind = f"{s.type} (or as {s.type_key} says)" if s.type_key else s.type
            needed = f"  {_requirement(s)}" if direction == "consumes" else ""
            name = Text.assemble((s.name, "bold cyan"), f"  {kind}  at {s.key}", (needed, "yellow"))
            lines += terminal.wrap(name, width, 6, 2)
            lines += terminal.wrap(s.description, width, 4)
    return lines


def step_panel(step: Step, width: int) -> list[Text]:
    """A step's manifest as lines: its id and name, what it is, its artifacts, parameters, strategies, errors."""
    lines = terminal.wrap(Text.assemble((step.id, "bold cyan"), " · ", step.name), width)
    lines += terminal.wrap(step.description, width, 2)
    lines += terminal.key_values(
        [
            ("algorithm", step.algorithm),
            ("configs", ", ".join(step.configs)),
            ("tags", ", ".join(step.tags)),
            ("resources", ", ".join(f"{k}={v}" for k, v in step.resources.items())),
            ("manifest", str(step.manifest_path)),
        ],
        width,
        2,
    )
    lines += _artifact_lines(step, width)
    if step.parameters:
        lines += terminal.heading("parameters (override with key=value)", width)
        for p in step.parameters:
            lines += terminal.wrap(Text.assemble((p.name, "bold cyan"), f" = {p.default!r}"), width, 6, 2)
            lines += terminal.wrap(p.description, width, 4)
    if step.strategies:
        lines += terminal.heading("strategies", width)
        for s in step.strategies:
            lines += terminal.wrap(Text.assemble(("when ", "bold"), s["when"]), width, 7, 2)
            lines += terminal.wrap(Text.assemble(("then ", "bold"), s["then"]), width, 7, 2)
    if step.errors:
        lines += terminal.heading("errors and recovery", width)
        for e in step.errors:
            lines += terminal.wrap(Text.assemble((e["name"], "bold red"), ": ", e["recovery"]), width, 4, 2)
    return lines


def dry_run(compiled: Compiled, width: int) -> list[Text]:
    from omegaconf import OmegaConf

    job, plan = compiled.job, compiled.plan
    where = f"profile {job.profile_name} ({job.profile_source})" if job.profile_name else "this machine"
    lines = terminal.heading("dry run: nothing was written, started or sent", width)
    lines += terminal.key_values(
        [
            ("step", f"{job.step_id} (algorithm {job.algorithm})"),
            ("config", f"{job.config_name} ({job.config_source})"),
            ("mode", f"{job.mode} on {where}, executor {job.executor}"),
            ("job dir", f"{compiled.job_dir} (not created: dry run)"),
            ("overrides", " ".join(mask_argv(job.overrides)) or "none"),
            ("passthrough", " ".join(mask_argv(job.passthrough)) or "none"),
            ("launch", plan.summary),
        ],
        width,
        2,
    )
    if job.notes:
        lines += terminal.heading("notes", width)
        for note in job.notes:
            lines += terminal.wrap(f"- {note}", width, 4, 2)
    if compiled.needs:
        lines += terminal.heading(Text.assemble(("the run will need", "yellow"), " (required, not given yet)"), width)
        for need in compiled.needs:
            lines += terminal.wrap(need, width, 4, 2)
    lines += terminal.heading("input artifacts (name, key, type, status; below, the reference)", width)
    for item in compiled.inputs:
        word, style = STATUS_WORDS[item.status]
        lines += terminal.wrap(
            Text.assemble((item.name, "bold cyan"), f"  {item.key}  {item.required_type}  ", (word, style)),
            width,
            4,
            2,
        )
        if item.ref:
            lines += terminal.wrap(item.ref, width, 4)
    lines += terminal.heading("command", width)
    command = mask_argv(plan.command)
    lines += terminal.shell_lines([SCRIPT_WORD if SCRIPT_MARK in word else word for word in command], width, 2)
    if any(SCRIPT_MARK in word for word in command):
        lines += terminal.wrap(f"({SCRIPT_WORD} is the script printed at the end, verbatim)", width, 4, 2)
    if plan.env:
        lines += terminal.heading("environment", width)
        for key, value in plan.env.items():
            lines += terminal.wrap(f"{key}={value}", width, 4, 2)
    if job.profile_name:
        lines += terminal.heading("profile", width)
        lines += terminal.yaml_lines(OmegaConf.to_yaml(OmegaConf.create(job.public_launcher_settings())), width, 2)
    lines += terminal.heading("merged config", width)
    lines += terminal.yaml_lines(OmegaConf.to_yaml(OmegaConf.create(job.public_config())), width, 2)
    return lines


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
    """The command's script (a word of several lines: Lepton's bash -c) and the files the job directory will hold,
    verbatim between header lines: no wrapping, no frame, so a script can be copied from a terminal or a pipe as it
    is."""
    scripts = [word for word in mask_argv(compiled.plan.command) if SCRIPT_MARK in word]
    blocks = [f"----- {SCRIPT_WORD}: the command's script -----\n{script.rstrip()}\n" for script in scripts]
    blocks += [
        f"----- {name} (written into the job dir) -----\n{content.rstrip()}\n"
        for name, content in compiled.plan.files.items()
    ]
    return "\n".join(blocks)


COMPARISON_HEADERS = ("figure", "A", "B", "B - A")


def comparison(rows: list[tuple[str, str, str, str]], a: str, b: str, width: int) -> list[Text]:
    """Two eval reports' figures (name, A, B, B - A): a table where its columns fit the width, else a block per
    figure (its name, then A and B with B - A); then which report each letter is."""
    columns = [max(len(row[i]) for row in [COMPARISON_HEADERS, *rows]) for i in range(4)]
    if sum(columns) + 2 * (len(columns) - 1) <= width:
        lines = [_aligned(COMPARISON_HEADERS, columns, "bold")] + [_aligned(row, columns) for row in rows]
    else:
        lines = []
        for name, first, second, delta in rows:
            lines += terminal.wrap(Text(name, style="bold"), width, 4, 0)
            lines += terminal.key_values([("A", first), ("B", second), ("B - A", delta)], width, 4)
    return lines + terminal.wrap(f"A: {a}", width, 3, 0) + terminal.wrap(f"B: {b}", width, 3, 0)


def _aligned(cells: tuple[str, ...], columns: list[int], style: str = "") -> Text:
    line = Text("  ".join(cell.ljust(room) for cell, room in zip(cells, columns)), style=style)
    line.rstrip()
    return line


def sayer(console: Console):
    """How the CLI says a progress line: broken at spaces at a terminal, one line in a log or a pipe (whole for
    grep), as errors are."""

    def say(line: str) -> None:
        text = Text.assemble(("rlsteps", "bold"), " ", line)
        terminal.print_lines(console, terminal.wrap(text, console.width, 8, 0) if console.is_terminal else [text])

    return say
