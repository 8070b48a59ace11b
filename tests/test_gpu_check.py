"""benchmarks/gpu_check.py, the one command for the GPU paths: what it does on a machine without CUDA, that a row
which fails, crashes or hangs fails alone and the table goes on, and (slow) its --cpu-smoke table with one tiny step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import gpu_check  # noqa: E402


def script(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_check.sh"), *args],
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rows(stdout: str) -> dict[str, tuple[str, str]]:
    """check -> (status, figures) from the printed table."""
    found = {}
    for check in gpu_check.CHECKS:
        for line in stdout.splitlines():
            if line.startswith(check.name + " "):
                status, _seconds, figures = line[len(check.name) :].split(maxsplit=2)
                found[check.name] = (status, figures)
    return found


def test_without_a_cuda_device_it_says_so_runs_nothing_and_exits_0():
    done = script(env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "no CUDA device: nothing to check"


def test_a_failed_a_crashed_and_a_hung_row_fail_alone_and_the_exit_is_non_zero(tmp_path, monkeypatch, capsys):
    def fails(ctx):
        raise gpu_check.Failed("the reward did not rise")

    def crashes(ctx):
        raise KeyError("perf/train_mfu")

    def hangs(ctx):
        gpu_check.call(ctx, "hang", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path)

    def skips(ctx):
        raise gpu_check.Skipped("vllm: not installed")

    checks = [
        gpu_check.Check("fails", fails),
        gpu_check.Check("crashes", crashes),
        gpu_check.Check("hangs", hangs, alone=True),
        gpu_check.Check("skips", skips),
        gpu_check.Check("on the GPU", lambda ctx: "ran", cuda_only="CUDA graphs need a GPU"),
        gpu_check.Check("works", lambda ctx: "42 tok/s", alone=True),
    ]
    monkeypatch.setattr(gpu_check, "CHECKS", checks)
    monkeypatch.setattr(gpu_check, "build_tiny_world", lambda ctx: None)
    code = gpu_check.main(["--cpu-smoke", "--timeout", "2", "--work", str(tmp_path / "work")])
    out = capsys.readouterr().out
    assert code == 1
    table = rows(out)
    assert table["fails"] == ("FAILED", "the reward did not rise")
    assert table["crashes"] == ("FAILED", "KeyError: 'perf/train_mfu'")
    assert table["hangs"][0] == "FAILED" and "timed out after 2 s" in table["hangs"][1]
    assert table["skips"] == ("skipped", "vllm: not installed")
    assert table["on the GPU"] == ("skipped", "needs CUDA: CUDA graphs need a GPU")
    assert table["works"] == ("ok", "42 tok/s")  # after the hang: the table went on
    assert "3 failed, 1 ok, 2 skipped" in out


def test_only_runs_the_rows_it_names(tmp_path, monkeypatch, capsys):
    checks = [gpu_check.Check("tiny rl/rs fp32", lambda ctx: "ran"), gpu_check.Check("megatron", lambda ctx: "ran")]
    monkeypatch.setattr(gpu_check, "CHECKS", checks)
    monkeypatch.setattr(gpu_check, "build_tiny_world", lambda ctx: None)
    assert gpu_check.main(["--cpu-smoke", "--only", "rl/rs", "--work", str(tmp_path)]) == 0
    table = rows(capsys.readouterr().out)
    assert table == {"tiny rl/rs fp32": ("ok", "ran"), "megatron": ("skipped", "not selected (--only)")}


def test_the_benchmarks_lines_are_read():
    generate = (
        "preset=tiny device=cuda ...\n"
        "greedy    builtin 0.100s (40960 tok/s)  hf.generate 0.500s (8192 tok/s)  builtin/hf=5.00  "
        "greedy tokens as hf: builtin 100%\n"
        "sampling  builtin 0.120s (34133 tok/s)  hf.generate 0.600s (6827 tok/s)  builtin/hf=5.00\n"
    )
    assert gpu_check.generate_ratios(generate) == {"greedy": 5.0, "sampling": 5.0}


@pytest.mark.slow
def test_the_cpu_smoke_table_runs_one_tiny_step_and_skips_the_cuda_rows(tiny_world, tmp_path):
    done = script(
        "--cpu-smoke", "--only", "tiny rl/rs fp32", "--smoke-steps", "1", "--work", str(tmp_path), timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = rows(done.stdout)
    assert set(table) == {check.name for check in gpu_check.CHECKS}
    status, figures = table["tiny rl/rs fp32"]
    assert status == "ok" and figures.startswith("1 steps, true reward"), figures
    for check in gpu_check.CHECKS:
        if check.cuda_only:
            assert table[check.name] == ("skipped", f"needs CUDA: {check.cuda_only}")
    assert table["fsdp2 two processes (nccl)"][0] == "skipped"
    assert (tmp_path / "rl_rs-fp32" / ".rlsteps" / "runs" / "rl_rs-tiny" / "policy").is_dir()


def test_the_driver_reads_a_runs_metrics_with_nothing_of_rlsteps_in_its_own_interpreter(tmp_path):
    """A bare GPU machine's python runs the driver; rlsteps comes from the rows' environment (PYTHONPATH=src)."""
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "val/true_reward": 0.5}\n{"step": 2, "val/true_reward": 2.0}\n'
    )
    driver = f"""
import sys
from pathlib import Path

class NoRlsteps:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "rlsteps":
            raise ImportError("rlsteps is not installed in the driver's interpreter")

sys.meta_path.insert(0, NoRlsteps())
sys.path.insert(0, {str(BENCHMARKS)!r})
import gpu_check

env = {{"PATH": "/usr/bin:/bin", "PYTHONPATH": {str(BENCHMARKS.parent / "src")!r}}}
ctx = gpu_check.Context(Path("."), "cpu", 0, "", 2, 60, False, env=env)
print(gpu_check.series(ctx, Path({str(tmp_path)!r}), "val/true_reward"))
"""
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0.5, 2.0]"
