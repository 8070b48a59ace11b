"""Bad inputs and faults through the real command line, one case each: the exit code the docs give it, one line
naming the cause and one with the fix, no traceback, and nothing left behind (no process, no job directory, no run
directory) where the run is refused before it starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlsteps.tiny.layout import load_tiny_world
from run_helpers import FAST, rlsteps

MARK = "RLSTEPS_BAD_INPUT_CASE"  # in the command's environment: every process it starts inherits it
TINY = ("run", "rl/rs", "-c", "tiny")
CUT_TO = 300_000  # bytes left of a weight file cut short (the tiny models' are about 680 kB)


# ---------------------------------------------------------------------------------------------------------------
# the bad files, written once


@pytest.fixture(scope="module")
def bad(tmp_path_factory, request) -> Path:
    """A folder of bad inputs, each small: prompt files broken line 2, weights cut short, a folder of notes."""
    tiny_world = load_tiny_world(0) or request.getfixturevalue("tiny_world")  # built: no torch import here
    d = tmp_path_factory.mktemp("bad")
    good = '{"prompt": "Describe the cat."}\n'
    (d / "latin1.jsonl").write_bytes(good.encode() + b'{"prompt": "Describe the caf\xe9."}\n')
    (d / "bad_json.jsonl").write_text(good + '{"prompt": \n')
    (d / "neither.jsonl").write_text(good + '{"text": "Describe the dog."}\n')
    (d / "duplicate.jsonl").write_text('{"id": "x", "prompt": "Describe the cat."}\n{"id": "x", "prompt": "Hi."}\n')
    (d / "empty_prompt.jsonl").write_text(good + '{"prompt": ""}\n')
    (d / "too_long.jsonl").write_text(good + json.dumps({"prompt": "Describe the cat. " * 40}) + "\n")
    (d / "a_file").write_text("a file where a run directory would go\n")
    for name, source in (("policy_cut", tiny_world.policy), ("reward_model_cut", tiny_world.reward_model)):
        shutil.copytree(source, d / name)
        assert (d / name / "model.safetensors").stat().st_size > CUT_TO
        os.truncate(d / name / "model.safetensors", CUT_TO)
    shutil.copytree(tiny_world.policy_megatron, d / "megatron_cut")
    [shard, *_] = sorted((d / "megatron_cut").glob("iter_*/*.distcp"))
    os.truncate(shard, 100_000)
    (d / "notes").mkdir()
    (d / "notes" / "notes.txt").write_text("a folder that holds no model\n")
    return d


# ---------------------------------------------------------------------------------------------------------------
# what a command left behind


def processes_of(marker: str, *needles: str) -> list[str]:
    """'pid: command line' of each live process whose environment holds MARK=marker (whatever the command started,
    however deep) or whose command line names one of needles (the test's folders)."""
    found, tag = [], f"{MARK}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if cmdline and (tag in environ or any(needle in cmdline for needle in needles)):  # no cmdline: a zombie
            found.append(f"{entry.name}: {cmdline}")
    return found


def leftover_processes(marker: str, *needles: str, grace_s: float = 0.0) -> list[str]:
    deadline = time.monotonic() + grace_s
    while (found := processes_of(marker, *needles)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_the_process_scan_finds_what_a_command_started(tmp_path, monkeypatch):
    """The check every case ends with is not vacuous: a process that inherited the marker is found, and once it is
    gone, nothing is."""
    marker = marked(monkeypatch)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=dict(os.environ))
    try:  # until the child has exec'd, its /proc entry shows no command line yet (a loaded machine takes a while)
        deadline = time.monotonic() + 30
        while not any(line.startswith(f"{child.pid}: ") for line in processes_of(marker)):
            assert time.monotonic() < deadline, f"process {child.pid} not found by the scan in 30 s"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
    assert leftover_processes(marker, str(tmp_path)) == []


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def marked(monkeypatch) -> str:
    """A fresh marker in the environment the next command inherits (run_helpers copies os.environ)."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARK, marker)
    return marker


def merged(*argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI as rlsteps() runs it, stdout and stderr in one stream, in the order a terminal shows them."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "rlsteps.cli", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------------------------------------------------
# refused before anything starts


@dataclass(frozen=True)
class Case:
    overrides: tuple[str, ...]  # "{d}" stands for the folder of bad files
    exit_code: int
    message: tuple[str, ...]  # words of the error line
    fix: tuple[str, ...]  # words of the fix line


LINE_FIX = ('{"prompt": "..."}', '{"messages"')
RESOLVERS = ("oc.env", "tiny", r"\${...}")
CASES = {
    "prompt file with a byte that is not UTF-8": Case(
        ("inputs.prompts={d}/latin1.jsonl",),
        3,
        ("input 'prompts'", "{d}/latin1.jsonl:2:", "not UTF-8", "byte 29 is 0xe9"),
        ("UTF-8", "iconv"),
    ),
    "policy's model.safetensors cut short": Case(
        ("inputs.policy={d}/policy_cut",),
        3,
        ("input 'policy'", "{d}/policy_cut/model.safetensors", "cut short", f"{CUT_TO} bytes"),
        ("again", "inputs.policy"),
    ),
    "reward model's model.safetensors cut short": Case(
        ("inputs.reward_model={d}/reward_model_cut",),
        3,
        ("input 'reward_model'", "{d}/reward_model_cut/model.safetensors", "cut short", f"{CUT_TO} bytes"),
        ("again", "inputs.reward_model"),
    ),
    "megatron policy's .distcp cut short": Case(
        ("inputs.policy={d}/megatron_cut",),
        3,
        ("input 'policy'", "{d}/megatron_cut/iter_0000000/", ".distcp is cut short", "100000 bytes", ".metadata"),
        ("again", "inputs.policy"),
    ),
    "override ${...} naming no key": Case(
        ("train.lr=${nope.key}",),
        2,
        ("override 'train.lr=${nope.key}'", "'nope.key' not found"),
        ("${train.lr}", r"\${...}"),
    ),
    "override ${...} with an unknown resolver": Case(
        ("train.lr=${nope:x}",),
        2,
        ("override 'train.lr=${nope:x}'", "Unsupported interpolation type nope"),
        ("the resolvers are", *RESOLVERS),
    ),
    "override ${oc.env:...} of an unset variable": Case(
        ("train.lr=${oc.env:RLSTEPS_NO_SUCH_VARIABLE}",),
        2,
        ("override 'train.lr=${oc.env:RLSTEPS_NO_SUCH_VARIABLE}'", "RLSTEPS_NO_SUCH_VARIABLE", "not found"),
        ("environment variable", "plain value"),
    ),
    "override ${ left open": Case(
        ("train.lr=${train.lr",),
        2,
        ("override 'train.lr=${train.lr'",),
        ("close each ${ with }",),
    ),
    "prompt file line that is not JSON": Case(
        ("inputs.prompts={d}/bad_json.jsonl",),
        3,
        ("input 'prompts'", "{d}/bad_json.jsonl:2:", "invalid JSON"),
        LINE_FIX,
    ),
    "prompt file line with neither prompt nor messages": Case(
        ("inputs.prompts={d}/neither.jsonl",),
        3,
        ("input 'prompts'", "{d}/neither.jsonl:2:", '"prompt" or "messages"', "neither"),
        LINE_FIX,
    ),
    "prompt file with a duplicate id": Case(
        ("inputs.prompts={d}/duplicate.jsonl",),
        3,
        ("input 'prompts'", "{d}/duplicate.jsonl:2:", "duplicate id 'x'", "line 1"),
        LINE_FIX,
    ),
    "prompt file with an empty prompt": Case(
        ("inputs.prompts={d}/empty_prompt.jsonl",),
        3,
        ("input 'prompts'", "{d}/empty_prompt.jsonl:2:", "the prompt is empty"),
        LINE_FIX,
    ),
    "output.dir that is a file": Case(
        ("output.dir={d}/a_file",),
        2,
        ("output.dir {d}/a_file is a file, not a directory",),
        ("output.dir=PATH", "move {d}/a_file away"),
    ),
    "output.dir under a file": Case(
        ("output.dir={d}/a_file/run",),
        2,
        ("output.dir {d}/a_file/run lies under a file, {d}/a_file, not a directory",),
        ("output.dir=PATH", "move {d}/a_file away"),
    ),
    "missing prompt file": Case(
        ("inputs.prompts={d}/absent.jsonl",),
        3,
        ("input 'prompts'", "{d}/absent.jsonl does not exist"),
        ("inputs.prompts=PATH", "prompt_jsonl"),
    ),
    "missing policy": Case(
        ("inputs.policy={d}/absent_policy",),
        3,
        ("input 'policy'", "{d}/absent_policy does not exist"),
        ("inputs.policy=PATH", "checkpoint"),
    ),
    "prompt file given as the policy": Case(
        ("inputs.policy={d}/duplicate.jsonl",),
        3,
        ("input 'policy'", "{d}/duplicate.jsonl is prompt_jsonl", "checkpoint", "required"),
        ("point inputs.policy at a checkpoint",),
    ),
    "folder of a text file given as the reward model": Case(
        ("inputs.reward_model={d}/notes",),
        3,
        ("input 'reward_model'", "{d}/notes is not a recognised artifact", "reward_model_hf is required"),
        ("point inputs.reward_model at a reward_model_hf",),
    ),
    "unknown override key": Case(
        ("train.lrr=0.1",),
        2,
        ("unknown config key 'train.lrr'",),
        ("did you mean 'train.lr'",),
    ),
    "a key named as TRL's trainers name it": Case(
        ("train.learning_rate=1e-3",),
        2,
        ("unknown config key 'train.learning_rate'",),
        ("did you mean 'train.lr'",),
    ),
    "override value of the wrong type": Case(
        ("train.lr=abc",),
        2,
        ("train.lr", "valid number", "'abc'"),
        ("train.lr", "a value of the type it takes"),
    ),
}


def _at(words: tuple[str, ...], d: Path) -> list[str]:
    return [word.replace("{d}", str(d)) for word in words]


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_refused_in_one_line_before_anything_starts(name, bad, tmp_path, monkeypatch):
    case = CASES[name]
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    marker = marked(monkeypatch)
    result = rlsteps(*TINY, f"output.dir={out}", *_at(case.overrides, bad), cwd=work, timeout=120)
    shown = result.stdout + result.stderr

    assert result.returncode == case.exit_code, shown
    assert "Traceback" not in shown, shown
    assert result.stdout == "", shown  # a refusal prints its two lines and nothing else
    [error, *rest] = result.stderr.splitlines()
    assert error.startswith("error: ") and len(rest) <= 1, shown
    for word in _at(case.message, bad):
        assert word in error, f"{word!r} not in {error!r}"
    # nothing started, nothing written: no process, no job directory, no run directory
    assert leftover_processes(marker, str(tmp_path)) == []
    assert files_under(work) == [] and not out.exists()

    [fix] = rest
    assert fix.startswith("fix: "), shown
    for word in _at(case.fix, bad):
        assert word in fix, f"{word!r} not in {fix!r}"


# ---------------------------------------------------------------------------------------------------------------
# the dry run: everything printed, then exit 3 with one line naming each input the run would refuse


DRY_RUNS = {
    "prompt file with a byte that is not UTF-8": (
        ("inputs.prompts={d}/latin1.jsonl",),
        {"prompts": "malformed"},
        ("{d}/latin1.jsonl:2: not UTF-8",),
    ),
    "policy's model.safetensors cut short": (
        ("inputs.policy={d}/policy_cut",),
        {"policy": "malformed"},
        ("{d}/policy_cut/model.safetensors is cut short",),
    ),
    "prompt longer than data.max_prompt_tokens": (
        ("inputs.prompts={d}/too_long.jsonl",),
        {"prompts": "malformed"},
        ("{d}/too_long.jsonl:2: the prompt has 200 tokens, more than max_prompt_tokens=64",),
    ),
    "prompt file with an empty prompt": (
        ("inputs.prompts={d}/empty_prompt.jsonl",),
        {"prompts": "malformed"},
        ("{d}/empty_prompt.jsonl:2: the prompt is empty",),
    ),
    "missing prompt file": (
        ("inputs.prompts={d}/absent.jsonl",),
        {"prompts": "missing"},
        ("{d}/absent.jsonl does not exist",),
    ),
    "folder of a text file given as the reward model": (
        ("inputs.reward_model={d}/notes",),
        {"reward_model": "wrong type"},
        ("{d}/notes is not a recognised artifact",),
    ),
    "two at once": (
        ("inputs.prompts={d}/duplicate.jsonl", "inputs.policy={d}/absent_policy"),
        {"prompts": "malformed", "policy": "missing"},
        ("{d}/duplicate.jsonl:2: duplicate id", "{d}/absent_policy does not exist"),
    ),
}


@pytest.mark.parametrize("name", list(DRY_RUNS))
def test_a_dry_run_prints_everything_then_exits_3_naming_each_given_input_the_run_would_refuse(
    name, bad, tmp_path, monkeypatch
):
    overrides, statuses, problems = DRY_RUNS[name]
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    marker = marked(monkeypatch)
    result = merged(*TINY, "--dry-run", f"output.dir={out}", *_at(overrides, bad), cwd=work)
    shown = result.stdout

    assert result.returncode == 3, shown
    assert "Traceback" not in shown, shown
    for part in ("dry run: nothing was written, started or sent", "merged config", "-m rlsteps.engine.run.worker"):
        assert part in shown, part
    for input_name, status in statuses.items():  # the inputs table says it too
        assert any(line.startswith(f"  {input_name}  ") and status in line for line in shown.splitlines()), shown
    # the last word: one error line naming each input, one fix line; the only error of the whole output
    *_, error, fix = shown.rstrip("\n").splitlines()
    count = len(statuses)
    assert error.startswith(f"error: the run would refuse {count} input{'s' if count > 1 else ''}: "), shown
    assert [line for line in shown.splitlines() if line.startswith("error:")] == [error]
    for problem in _at(problems, bad):
        assert problem in error, f"{problem!r} not in {error!r}"
    assert fix.startswith("fix: ") and fix.count(";") == count - 1, fix

    assert leftover_processes(marker, str(tmp_path)) == []
    assert files_under(work) == [] and not out.exists()


def test_a_dry_run_whose_inputs_are_not_given_yet_exits_0_listing_them(tmp_path, monkeypatch):
    marker = marked(monkeypatch)
    result = merged("run", "rl/rs", "-c", "default", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert "Traceback" not in result.stdout and "error:" not in result.stdout
    assert "the run will need" in result.stdout
    for key in ("inputs.prompts=PATH", "inputs.policy=PATH", "inputs.reward_model=PATH"):
        assert key in result.stdout
    assert leftover_processes(marker, str(tmp_path)) == [] and files_under(tmp_path) == []


def test_a_run_whose_required_keys_are_unset_is_refused_with_exit_2_naming_them(tmp_path, monkeypatch):
    """What the dry run of `-c default` lists (above), the run refuses with, before anything starts."""
    marker = marked(monkeypatch)
    result = rlsteps("run", "rl/rs", "-c", "default", f"output.dir={tmp_path / 'out'}", cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [
        "error: required config keys without a value: inputs.policy, inputs.prompts",
        "fix: pass inputs.policy=VALUE inputs.prompts=VALUE",
    ]
    assert leftover_processes(marker, str(tmp_path)) == [] and files_under(tmp_path) == []


# ---------------------------------------------------------------------------------------------------------------
# a fault the run meets once started: the reward server does not answer


def test_an_unreachable_reward_server_stops_the_run_with_exit_1_naming_the_url(bad, tmp_path, monkeypatch):
    """The worker starts (the server is only asked at the first step's scoring), finds nothing at the URL, and stops:
    exit 1 (the run failed), the URL and what to do in the log and in the CLI's error line (the cause the worker
    left beside its exit code), no checkpoint (no step was done), no process left."""
    url = "http://127.0.0.1:9"  # the discard port: nothing listens there
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    marker = marked(monkeypatch)
    quick = ["rm.timeout_s=2", "rm.max_retries=1", "rm.backoff_s=0.1", "train.max_steps=1", "validation.interval=0"]
    result = rlsteps(*TINY, f"output.dir={out}", f"rm.url={url}", *quick, *FAST, cwd=work, timeout=300)
    shown = result.stdout + result.stderr

    assert result.returncode == 1, shown
    assert "Traceback" not in shown, shown
    [cause, error] = [line for line in shown.splitlines() if "rewards unavailable" in line]  # the log, the error
    assert f"reward server at {url} unavailable after 2 attempts" in cause and "Connection refused" in cause, cause
    assert "; check the reward server at rm.url: is it up, and reachable from here? (fix: " in cause, cause
    [job] = (work / ".rlsteps" / "jobs").iterdir()  # every real run writes its job directory
    *_, last_error, fix = result.stderr.rstrip("\n").splitlines()
    assert last_error == error and error.startswith("error: rl/rs failed with exit code 1: rewards unavailable"), shown
    start = f"fix: start the reward server at {url} (or set rm.url to one that answers), then rerun `rlsteps run "
    assert fix.startswith(start) and fix.endswith("`: no checkpoint yet: a rerun starts from step 0"), shown
    assert [line for line in shown.splitlines() if line.startswith("error:")] == [error]
    assert (job / "job.yaml").is_file() and (job / "exit_code").read_text().strip() == "1"

    assert leftover_processes(marker, str(tmp_path), grace_s=2) == []
    written = files_under(out)
    assert "policy" not in written and not [f for f in written if "step_" in f], written  # no output, no checkpoint
    assert "rewards unavailable at step 1" in (out / "train.log").read_text()


@pytest.mark.slow
def test_a_prompt_the_run_refuses_for_its_length_the_dry_run_refuses_with_the_same_words(bad, tmp_path, monkeypatch):
    """The run measures with the policy's own tokenizer class (transformers); the dry run with its files alone (no
    torch): the same count, the same line, the same exit code."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    marker = marked(monkeypatch)
    given = (f"output.dir={out}", f"inputs.prompts={bad}/too_long.jsonl", *FAST)
    dry = rlsteps(*TINY, "--dry-run", *given, cwd=work, timeout=120)
    run = rlsteps(*TINY, *given, cwd=work, timeout=300)
    assert (dry.returncode, run.returncode) == (3, 3), run.stderr
    assert "Traceback" not in dry.stderr + run.stderr, run.stderr
    said = "input 'prompts': {d}/too_long.jsonl:2: the prompt has 200 tokens, more than max_prompt_tokens=64"
    said = said.format(d=bad)
    [dry_error] = [line for line in dry.stderr.splitlines() if line.startswith("error:")]
    [run_error] = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert dry_error.endswith(said), dry_error
    assert run_error.startswith("error: rl/rs failed with exit code 3: ") and said in run_error, run_error
    assert leftover_processes(marker, str(tmp_path), grace_s=2) == []
    assert not [f for f in files_under(out) if "step_" in f or f.startswith("policy")]
