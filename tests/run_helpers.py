"""Running tiny steps end to end as a user does, and reading what they wrote."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from rlsteps.contract.run_files import read_metrics
from rlsteps.engine.records.metrics import metric_series

FAST = ["run.num_threads=1"]  # one thread: steadier and faster for tiny models on a shared 2-core machine


def rlsteps(
    *argv: str, cwd: Path, timeout: float = 600, python: Path | str = sys.executable
) -> subprocess.CompletedProcess:
    """The CLI as a user runs it; python: the environment's interpreter (the vLLM one, say)."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [str(python), "-m", "rlsteps.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def start_rlsteps(*argv: str, cwd: Path, log: Path, python: Path | str = sys.executable) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(python), "-m", "rlsteps.cli", *argv],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the run's whole tree: the CLI's process group and the group of each process under it (an attached
    worker runs in a group of its own), as a power loss would end it."""
    groups, killed = {process.pid}, list(descendants(process.pid))
    for pid in killed:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()
    deadline = time.monotonic() + 10  # a killed worker outlives its CLI until reaped: a rerun would find it running
    while any(Path(f"/proc/{pid}").exists() for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] != "Z":
                found[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    return found


def descendants(root: int) -> dict[int, str]:
    table, found, frontier = processes(), {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, cmdline) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = cmdline
                frontier.append(pid)
    return found


def wait_for(path: Path, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the run exited with {process.returncode} before {path} appeared")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout}s")
        time.sleep(0.2)


def straight_and_resumed(
    step: str, slug: str, overrides: list[str], tmp_path: Path, python: Path | str = sys.executable
) -> tuple[Path, Path]:
    """The same tiny run twice: once straight through, once SIGKILLed once its step-2 checkpoint is written and rerun,
    which must resume mid-run: from step 2, or from a later checkpoint a fast run wrote before the kill landed (never
    from its last). Returns the two runs' directories (straight, resumed). python: the environment's interpreter."""
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    first = rlsteps("run", step, "-c", "tiny", *overrides, cwd=straight, python=python)
    assert first.returncode == 0, first.stderr[-3000:]

    log = tmp_path / "first.log"
    process = start_rlsteps("run", step, "-c", "tiny", *overrides, cwd=interrupted, log=log, python=python)
    wait_for(run_dir(interrupted, slug) / "checkpoints" / "step_2" / "COMPLETE", 300, process)
    kill_group(process)
    resumed = rlsteps("run", step, "-c", "tiny", *overrides, cwd=interrupted, python=python)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    resumed_from = re.search(r"resuming from \S+ \(step (\d+)", resumed.stderr)
    assert resumed_from and "already done" not in resumed.stderr, resumed.stderr[-3000:]
    return run_dir(straight, slug), run_dir(interrupted, slug)


def run_dir(cwd: Path, step_slug: str, config: str = "tiny") -> Path:
    return cwd / ".rlsteps" / "runs" / f"{step_slug}-{config}"


def series(run: Path, key: str) -> list[float]:
    return metric_series(read_metrics(run / "metrics.jsonl"), key)[1]


def weights(model_dir: Path) -> dict:
    """name -> tensor of a checkpoint_hf (its safetensors) or a checkpoint_megatron (through the engine's reader)."""
    if (model_dir / "model.safetensors").is_file():
        return load_file(str(model_dir / "model.safetensors"))
    from rlsteps.engine.policy.model import load_policy

    return load_policy(model_dir)[0].state_dict()


def artifact_metadata(run: Path) -> dict:
    return json.loads((run / "policy" / "rlsteps_artifact.json").read_text())


def python_without_rlsteps(root: Path) -> Path:
    """A virtual environment with torch and the engine's dependencies (this one's site-packages on its path,
    without their .pth files, so the editable rlsteps is not found) but no rlsteps: a stock image's python."""
    import site

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    [site_packages] = [p for p in site.getsitepackages() if p.endswith("site-packages")]
    [own] = list(root.glob("lib/python*/site-packages"))
    (own / "engine-dependencies.pth").write_text(site_packages + "\n")
    python = root / "bin" / "python"
    probe = subprocess.run(
        [str(python), "-c", "import torch, omegaconf, rlsteps"], env={"PATH": "/usr/bin:/bin"}, capture_output=True
    )
    assert b"No module named 'rlsteps'" in probe.stderr, probe.stderr
    return python
