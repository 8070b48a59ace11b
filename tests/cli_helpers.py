"""Running the CLI through typer's runner (in process) and as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from rlsteps.cli.app import app, split_passthrough
from rlsteps.errors import RlstepsError

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str = ""

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def invoke(*argv: str) -> Result:
    """typer's runner; an RlstepsError maps to its exit code and message as main() prints them."""
    args, passthrough = split_passthrough(list(argv))
    result = CliRunner().invoke(
        app,
        args,
        obj={"passthrough": passthrough, "argv": ["rlsteps", *argv]},
        standalone_mode=False,
        env={"COLUMNS": "200"},
    )
    if isinstance(result.exception, RlstepsError):
        return Result(result.exception.exit_code, result.stdout, str(result.exception))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Result(result.exit_code or 0, result.stdout)


def run_cli(*argv: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    """`rlsteps ...` as a subprocess, exactly as a user runs it."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "rlsteps.cli", *argv],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def dry_run_in_fresh_python(*overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`rlsteps run rl/reinforce -c tiny --dry-run OVERRIDES` in a fresh Python; it prints the exit code and which of
    torch and transformers it imported (a dry run imports neither)."""
    argv = ["run", "rl/reinforce", "-c", "tiny", "--dry-run", *overrides]
    code = (
        "import sys, io, contextlib\n"
        "from rlsteps.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    code = main({argv!r})\n"
        "print(code, [m for m in ('torch', 'transformers') if m in sys.modules])\n"
    )
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=full_env)
