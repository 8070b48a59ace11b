"""What the command line prints fits 60, 80 and 120 columns: broken at spaces only, an id or a path never cut (one too
long for the line stands whole on a line of its own), and no line ends in spaces. `--help` shows flags as flags.

Each command runs through the command line's own main(), errors included, at each width (COLUMNS, as a terminal
sets it; errors are wrapped at a terminal only, so stderr is one here). The files a dry run prints after its
`----- NAME (written into the job dir) -----` lines are those files verbatim (a script must run as it is pasted),
and so is the script a command runs (Lepton's bash -c): their lines are held to no trailing spaces only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click
import pytest
import typer
from rich.console import Console

from rlsteps.cli.app import app, main
from seed_commands import SEED_COMMANDS
from test_jobs import finished_local_job

WIDTHS = (60, 80, 120)
REPO = Path(__file__).resolve().parents[1]
VERBATIM_HEADER = re.compile(r"^----- .* -----$")  # from the first on: a command's script, the job's files


@pytest.fixture
def project(tmp_path, monkeypatch, tiny_world):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(REPO / "profiles"))
    return tmp_path


def printed(argv: list[str], width: int, capsys, monkeypatch) -> tuple[int, list[str]]:
    """What the command prints at a terminal of `width` columns (errors are wrapped at a terminal only)."""
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(
        sys.modules["rlsteps.cli.app"], "err", Console(stderr=True, force_terminal=True, color_system=None, width=width)
    )
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).splitlines()


def assert_fits(lines: list[str], width: int, whole: list[str] = ()) -> None:
    """Every line (but a file's) fits, or is one word alone; no line ends in spaces; each of `whole` is on a line."""
    in_file = False
    for line in lines:
        assert line == line.rstrip(), f"trailing spaces: {line!r}"
        in_file = in_file or bool(VERBATIM_HEADER.match(line))
        if not in_file and len(line) > width:
            assert len(line.split()) == 1, f"{len(line)} > {width} columns and breakable: {line!r}"
    for word in whole:
        assert any(word in line for line in lines), f"{word} is cut or missing:\n" + "\n".join(lines)


@pytest.mark.parametrize("width", WIDTHS)
def test_list_show_and_version_fit(width, capsys, monkeypatch):
    from rlsteps.catalog import load_catalog

    steps = load_catalog().steps.values()
    code, lines = printed(["list"], width, capsys, monkeypatch)
    assert code == 0
    assert_fits(lines, width, [s.id for s in steps])
    for step in steps:
        code, lines = printed(["show", step.id], width, capsys, monkeypatch)
        keys = [spec.key for spec in step.consumes + step.produces]
        assert code == 0 and lines[0].startswith(step.id)
        assert_fits(lines, width, [step.id, str(step.manifest_path), *keys])
    code, lines = printed(["--version"], width, capsys, monkeypatch)
    assert code == 0 and lines[0].startswith("rlsteps 0.1.0")
    assert_fits(lines, width)


DRY_RUNS = [
    ["run", "rl/rs", "-c", "default", "--dry-run"],
    ["run", "rl/rs", "-c", "tiny", "-b", "my_slurm", "train.micro_batch_size=2", "--dry-run"],
    ["run", "rl/rlhf", "-c", "default", "-b", "my_lepton", "inputs.prompts=/data/train.jsonl", "--dry-run"],
    SEED_COMMANDS[2],  # rl/nemo_rl/rlhf on Slurm: the longest keys and paths
    ["pipeline", "run", str(REPO / "examples" / "pipelines" / "tiny.yaml"), "--dry-run"],
]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("argv", DRY_RUNS, ids=[" ".join(argv[:6]) for argv in DRY_RUNS])
def test_dry_runs_fit(argv, width, project, capsys, monkeypatch):
    code, lines = printed(argv, width, capsys, monkeypatch)
    assert code == 0, "\n".join(lines)
    whole = [word.partition("=")[0] for word in argv if "=" in word]  # the keys the command sets
    if argv[0] != "pipeline":
        whole.append(str(project / ".rlsteps" / "jobs"))  # the job dir's folder
    assert_fits(lines, width, whole)


@pytest.mark.parametrize("width", WIDTHS)
def test_jobs_fit(width, project, capsys, monkeypatch):
    name = "20261125-021240-6eef16-rl_nemo_rl_rlhf-40"
    record = finished_local_job(project / ".rlsteps" / "jobs", name, 1, job_id="4242")
    for argv, whole in ((["jobs", "list"], [name]), (["jobs", "status", name], [name, record.job_dir])):
        code, lines = printed(argv, width, capsys, monkeypatch)
        assert code == 0
        assert_fits(lines, width, whole)


ERRORS = [
    (["run", "rl/reinforc", "--dry-run"], 2, ["rl/reinforce"]),
    (["run", "rl/rs", "-c", "tiny", "-b", "my_slurm", "--dry-run"], 2, ["train.global_batch_size=128"]),
    (["run", "rl/rs", "-c", "tiny", "-b", "my_slurmm", "--dry-run"], 2, ["my_slurm"]),
    (
        ["run", "rl/rs", "-c", "tiny", "inputs.policy=/nowhere/at/all/policy", "--dry-run"],
        3,
        ["/nowhere/at/all/policy"],
    ),
]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(("argv", "exit_code", "whole"), ERRORS, ids=[" ".join(a[:7]) for a, _, _ in ERRORS])
def test_errors_fit(argv, exit_code, whole, width, project, capsys, monkeypatch):
    code, lines = printed(argv, width, capsys, monkeypatch)
    assert code == exit_code, "\n".join(lines)
    errors = lines[next(i for i, line in enumerate(lines) if line.startswith("error: ")) :]
    assert_fits(errors, width, whole)


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(prefix, group)]
    for name, command in getattr(group, "commands", {}).items():
        found += (
            _commands(command, (*prefix, name)) if isinstance(command, click.Group) else [((*prefix, name), command)]
        )
    return found


def test_help_shows_flags_as_flags_and_fits(capsys, monkeypatch):
    for words, command in _commands(typer.main.get_command(app)):
        code, lines = printed([*words, "--help"], 80, capsys, monkeypatch)
        assert code == 0, words
        text = "\n".join(lines)
        assert "<bool>" not in text, text
        flags = [p for p in command.params if isinstance(p, click.Option) and p.is_flag]
        for flag in flags:  # `-d, --dry-run  Print ...`: the flag's names, then its help, nothing between
            shown = ", ".join(sorted(flag.opts, key=len))
            assert re.search(rf"^  {re.escape(shown)}\s{{2,}}\S", text, flags=re.MULTILINE), (shown, text)
        assert_fits(lines, 80)


def test_an_error_is_one_line_and_its_fix_another_where_stderr_is_no_terminal(project, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    code = main(["run", "rl/rs", "-c", "tiny", "-b", "my_slurm", "--dry-run"])
    error, fix = capsys.readouterr().err.splitlines()
    assert code == 2 and error.startswith("error: ") and fix.startswith("fix: ") and len(error) > 60


def test_a_yaml_line_too_long_is_folded_as_yaml_allows_and_reads_back_the_same():
    import yaml

    from rlsteps.cli import terminal

    data = {
        "output": {"dir": "/lustre/users/me/rlsteps/runs/" + "x" * 60, "note": "words " * 20},
        "mounts": ["/lustre/datasets/" + "y" * 70 + ":/data", "short"],
    }
    text = yaml.safe_dump(data, sort_keys=False, width=1000)
    lines = [line.plain for line in terminal.yaml_lines(text, 60, 2)]
    assert_fits(lines, 60)
    assert yaml.safe_load("\n".join(line[2:] for line in lines)) == data


# Every table the command line prints, at each width against what it prints at 200 columns: the same words (a word
# broken mid-word would be a new one, a word cut off a missing one), but for the words of a layout that narrows
# (eval compare's column headings give way to a block per figure).
WIDE = 200
STAGES = ("sft-smollm2-verifiable-questions", "reinforce-smollm2-verifiable", "rlhf-smollm2-verifiable-questions")
TABLES = {
    "list": (["list"], set()),
    "jobs list": (["jobs", "list"], set()),
    "jobs list --state failed --last 1": (["jobs", "list", "--state", "failed", "--last", "1"], set()),
    "artifacts list": (["artifacts", "list"], set()),
    "artifacts lineage": (["artifacts", "lineage", STAGES[-1]], set()),
    "pipeline list": (["pipeline", "list"], set()),
    "eval compare": (["eval", "compare", "reports/before-training", "reports/after-training"], {"figure"}),
}


@pytest.fixture
def tables(project, monkeypatch):
    """A project with two jobs, a store holding a chain of three published versions, and two eval reports."""
    from rlsteps.artifacts.store import ArtifactStore
    from rlsteps.catalog import load_catalog
    from test_store import run_output

    finished_local_job(project / ".rlsteps" / "jobs", "20261125-021240-6eef16-rl_nemo_rl_rlhf-40", 1, job_id="4242")
    finished_local_job(project / ".rlsteps" / "jobs", "20261125-021240-7a1c02-rl_rs-41", 0, job_id="4243")
    store = ArtifactStore(str(project / "shared-store-of-the-team" / "artifacts"))
    monkeypatch.setenv("RLSTEPS_ARTIFACTS", store.root)
    catalog, source, prompts = load_catalog(), None, project / "verifiable-questions" / "train.jsonl"
    prompts.parent.mkdir()
    prompts.write_text("{}\n")
    for stage in STAGES:
        inputs = {"policy": source} if source else {"prompts": str(prompts)}
        output = run_output(project / "runs" / stage / "policy", f"job-{stage}", inputs)
        source = store.publish(catalog, str(output), stage).url
    interval = {"mean": 0.512, "low": 0.437, "high": 0.588}
    report = {
        "sources": {
            "exact_match": {
                "greedy": {"policy": interval, "difference": interval},
                "pass_at_k": {"4": {"policy": interval}},
            },
            "true_reward": {"accuracy": {"policy": interval}},
        },
        "judge": {"win_rate": interval},
    }
    for name in ("before-training", "after-training"):
        (project / "reports" / name).mkdir(parents=True)
        (project / "reports" / name / "report.json").write_text(json.dumps(report))
    return project


def words(lines: list[str]) -> set[str]:
    return {word for line in lines for word in line.split()}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("table", list(TABLES))
def test_every_table_fits_and_keeps_its_words_whole(table, width, tables, capsys, monkeypatch):
    argv, layout = TABLES[table]
    code, wide = printed(argv, WIDE, capsys, monkeypatch)
    assert code == 0 and wide, "\n".join(wide)
    code, lines = printed(argv, width, capsys, monkeypatch)
    assert code == 0
    assert_fits(lines, width)
    assert words(lines) - words(wide) == set(), "broken words:\n" + "\n".join(lines)
    assert words(wide) - layout - words(lines) == set(), "words left out:\n" + "\n".join(lines)
