"""The dry run refuses everything the run refuses at its start: for each check a run makes before it trains, one bad
input, run both ways (`rlsteps run rl/rs -c tiny ... --dry-run`, then the run), with the same exit code, the same
refusal (the dry run's line says "the run would refuse 1 input:" where the run's names the input alone) and the same
fix line; the run refused before any training (no job started where rlsteps itself refuses).

The checks, by where they are made:
- compiling the job (plan.compile, plan.runner): the config's keys and values, a reward function's spec, the
  worker's arguments after --, the processes the profile gives (contract.world_check), a reward function this Python
  cannot import or whose module defines no such name (plan.reward_functions), a LoRA run without peft
  (plan.worker_extras: installed here, so test_failure_fixes.py checks it where peft is hidden);
- the inputs (artifacts.inputs, contract.input_check, weight_files, hub, plan.prompt_check): absent, of no accepted
  type, weights cut short, a policy without a tokenizer, a Hub id not in the cache offline, a prompt file's bad line;
- output.dir (contract.output_dir, disk, run_lock, checkpoint_damage, run_identity): not a directory, in use by a
  live run, damaged checkpoints with none intact, checkpoints of a run with another config;
- the worker, before the policy loads: every prompt measured with the policy's tokenizer (slow: the dry run measures
  torch-free, the run in its worker).
A full disk and a read-only output.dir are paired in test_output_dir.py (they need a mount), a checkpoint_megatron
output the policy's architecture has no layout for in test_output_form.py. What the dry run does not refuse on
purpose: required keys not set yet (it lists them under "the run will need", exit 0).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlsteps.contract.run_lock import RunLock
from rlsteps.tiny.layout import load_tiny_world
from run_helpers import FAST, rlsteps

PROMPT_LINE_FIX = 'fix: each line must be {"prompt": "..."} or {"messages": [{"role", "content"}, ...]}'


@dataclass(frozen=True)
class Pair:
    given: tuple[str, ...]  # overrides; "{d}" is the folder of bad files, "{out}" the run directory
    exit_code: int
    error: str  # the refusal, after "error: " (and the run's "STEP failed with exit code N: ")
    fix: str | None = None  # the fix line, when the test names it (the dry run's and the run's are compared anyway)
    before: Callable[[Path, Path], object] | None = None  # (bad files, run directory) -> what it holds while run
    step: str = "rl/rs"


def lock_it(_bad: Path, out: Path) -> RunLock:
    return RunLock(out, job="20260101-120000-rl_rs-3f9a1c", job_dir=str(out.parent)).acquire()


def checkpoint_of_another_run(bad: Path, out: Path) -> None:
    """A complete step_1 (its files are not checked: start_over_if_damaged=true) under a run.json whose identity
    is this config's with another learning rate."""
    from rlsteps.catalog import load_catalog
    from rlsteps.contract.config import STEP_SCHEMAS
    from rlsteps.contract.run_identity import RUN_FILE, identity
    from rlsteps.plan.compile import compile_job

    job = compile_job(load_catalog().find("rl/rs"), "tiny", overrides=[f"output.dir={out}"])
    config = identity(STEP_SCHEMAS["rs"].model_validate(job.config).model_dump(mode="json"))
    (out / "checkpoints" / "step_1").mkdir(parents=True)
    (out / "checkpoints" / "step_1" / "COMPLETE").write_text("")
    (out / RUN_FILE).write_text(json.dumps({"identity": {**config, "train.lr": 0.5}}))


def damaged_checkpoint(_bad: Path, out: Path) -> None:
    (out / "checkpoints" / "step_1").mkdir(parents=True)
    (out / "checkpoints" / "step_1" / "COMPLETE").write_text("")


PAIRS = {
    "unknown key": Pair(("train.lrr=1",), 2, "unknown config key 'train.lrr'", "fix: did you mean 'train.lr'?"),
    "value of the wrong type": Pair(("train.lr=abc",), 2, "invalid config: train.lr: Input should be a valid number"),
    "reward function spec": Pair(
        ("rewards.mine.function=nocolon",), 2, "invalid config: function 'nocolon' must read 'package.module:function'"
    ),
    "validation function spec": Pair(
        ("+validation.reward_functions.exact=nocolon",), 2, "reward function 'nocolon' must read 'package.module"
    ),
    "worker argument": Pair(("--", "--nope"), 2, "the worker does not accept '--nope'"),
    "processes": Pair(("-r", "three"), 2, "the step cannot run on 3 processes (profile three: 1 node(s) x 3 "),
    "reward function module": Pair(
        ("rewards.mine.function=no_such_module:reward",),
        2,
        "reward function 'no_such_module:reward': cannot import no_such_module: No module named 'no_such_module'",
        "fix: make no_such_module importable where the run starts (its folder on PYTHONPATH, or its package installed)",
    ),
    "reward function name": Pair(
        ("rewards.mine.function=my_rewards:missing",),
        2,
        "reward function 'my_rewards:missing': my_rewards has no callable 'missing'",
    ),  # fmt: skip
    "validation function module": Pair(
        ("+validation.reward_functions.exact=no_such_module:exact",),
        2,
        "reward function 'no_such_module:exact': cannot import no_such_module",
    ),  # fmt: skip
    "NeMo-RL's engine on this machine": Pair(
        ("engine=nemo_rl",), 2, "engine=nemo_rl runs inside NeMo-RL's container on GPU nodes", step="rl/nemo_rl/rlhf"
    ),
    "policy absent": Pair(("inputs.policy={d}/absent",), 3, "input 'policy': {d}/absent does not exist"),
    "policy of no known type": Pair(("inputs.policy={d}/notes",), 3, "input 'policy': {d}/notes is not a recognised "),
    "policy weights cut short": Pair(
        ("inputs.policy={d}/policy_cut",), 3, "input 'policy': {d}/policy_cut/model.safetensors is cut short: "
    ),
    "policy without a tokenizer": Pair(
        ("inputs.policy={d}/policy_untokenized",), 3, "input 'policy': {d}/policy_untokenized holds no tokenizer ("
    ),
    "policy a Hub id not in the cache": Pair(
        ("inputs.policy=no-such-org/no-such-model",),
        3,
        "input 'policy': no-such-org/no-such-model is not a path here nor a Hugging Face Hub model in the cache",
    ),  # fmt: skip
    "prompt file not JSON": Pair(
        ("inputs.prompts={d}/bad_json.jsonl",),
        3,
        "input 'prompts': {d}/bad_json.jsonl:2: invalid JSON",
        PROMPT_LINE_FIX,
    ),
    "prompt file duplicate ids": Pair(("inputs.prompts={d}/duplicate.jsonl",), 3, "input 'prompts': {d}/duplicate"),
    "output.dir a file": Pair(("output.dir={d}/a_file",), 2, "output.dir {d}/a_file is a file, not a directory"),
    "output.dir in use": Pair((), 2, "output.dir {out} is in use by job 20260101-120000-rl_rs-3f9a1c", None, lock_it),
    "damaged checkpoints, none intact": Pair(
        (), 1, "checkpoint {out}/checkpoints/step_1 is damaged (", None, damaged_checkpoint
    ),
    "checkpoints of another config": Pair(
        ("checkpoint.start_over_if_damaged=true",),
        2,
        "{out} holds checkpoints of a run with another config: train.lr (0.5 -> ",
        "fix: pass output.dir=NEW_DIR for a new run, or move {out} away; rerun with the recorded config to resume it",
        checkpoint_of_another_run,
    ),  # fmt: skip
    "prompt longer than max_prompt_tokens": Pair(
        ("inputs.prompts={d}/too_long.jsonl",),
        3,
        "input 'prompts': {d}/too_long.jsonl:2: the prompt has 200 tokens, more than max_prompt_tokens=64",
        "fix: shorten that prompt, or raise data.max_prompt_tokens (rollouts grow with it)",
    ),  # fmt: skip
}
MEASURED_IN_THE_WORKER = {"prompt longer than max_prompt_tokens"}  # the run's worker starts, then refuses


@pytest.fixture(scope="module")
def bad(tmp_path_factory, request) -> Path:
    """The bad files, each small; my_rewards.py on the commands' PYTHONPATH; a profile of three processes."""
    world = load_tiny_world(0) or request.getfixturevalue("tiny_world")  # built: no torch import here
    d = tmp_path_factory.mktemp("bad")
    good = '{"prompt": "Describe the cat."}\n'
    (d / "bad_json.jsonl").write_text(good + '{"prompt": \n')
    (d / "duplicate.jsonl").write_text('{"id": "x", "prompt": "Describe the cat."}\n{"id": "x", "prompt": "Hi."}\n')
    (d / "too_long.jsonl").write_text(good + json.dumps({"prompt": "Describe the cat. " * 40}) + "\n")
    (d / "a_file").write_text("a file where a run directory would go\n")
    (d / "notes").mkdir()
    (d / "notes" / "notes.txt").write_text("a folder that holds no model\n")
    shutil.copytree(world.policy, d / "policy_cut")
    os.truncate(d / "policy_cut" / "model.safetensors", 300_000)
    shutil.copytree(world.policy, d / "policy_untokenized")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (d / "policy_untokenized" / name).unlink()
    (d / "my_rewards.py").write_text("def reward(messages, response):\n    return 0.0\n")
    return d


def placed(text: str, bad: Path, out: Path) -> str:
    return text.replace("{d}", str(bad)).replace("{out}", str(out))


def refusal(stderr: str) -> tuple[str, str | None]:
    """(the error line's refusal, the fix line) of a command's last error."""
    lines = stderr.rstrip("\n").splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert errors, stderr[-3000:]
    error = lines[errors[-1]].removeprefix("error: ")
    error = re.sub(r"^the run would refuse 1 input: |^\S+ failed with exit code \d+: ", "", error)
    fix = lines[errors[-1] + 1] if errors[-1] + 1 < len(lines) else None
    return error, fix


@pytest.mark.parametrize(
    "case",
    [pytest.param(name, marks=pytest.mark.slow) if name in MEASURED_IN_THE_WORKER else name for name in PAIRS],
)
def test_the_dry_run_refuses_what_the_run_refuses_at_its_start(case, bad, tmp_path, monkeypatch):
    pair = PAIRS[case]
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "rlsteps.yaml").write_text("profiles:\n  three: {executor: local, nprocs_per_node: 3}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(bad), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    held = pair.before(bad, out) if pair.before else None
    given = [placed(word, bad, out) for word in pair.given]
    overrides, passthrough = (given[: given.index("--")], given[given.index("--") :]) if "--" in given else (given, [])
    quick = [*FAST, "train.max_steps=1"] if pair.step == "rl/rs" else []  # the embedded engine's keys
    argv = ["run", pair.step, "-c", "tiny", f"output.dir={out}", *quick, *overrides]
    try:
        dry = rlsteps(*argv, "--dry-run", *passthrough, cwd=work, timeout=120)
        run = rlsteps(*argv, *passthrough, cwd=work, timeout=300)
    finally:
        if held is not None:
            held.release()
    assert (dry.returncode, run.returncode) == (pair.exit_code, pair.exit_code), run.stderr[-3000:]
    assert "Traceback" not in dry.stderr + run.stderr, run.stderr[-3000:]
    (dry_error, dry_fix), (run_error, run_fix) = refusal(dry.stderr), refusal(run.stderr)
    assert dry_error == run_error and dry_fix == run_fix, (dry.stderr[-2000:], run.stderr[-2000:])
    assert run_error.startswith(placed(pair.error, bad, out)), run_error
    assert pair.fix is None or run_fix == placed(pair.fix, bad, out), run_fix
    assert not (out / "metrics.jsonl").exists() and not (out / "policy").exists()  # nothing trained
    jobs = work / ".rlsteps" / "jobs"
    assert jobs.is_dir() == (case in MEASURED_IN_THE_WORKER), run.stderr[-2000:]  # refused before a job started
