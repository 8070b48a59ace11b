"""Reward servers users already run, as the tests' real counterparts: vLLM's pooling server (its CPU build, in
.venv-vllm) and NeMo-Aligner's PyTriton reward server (tests/triton_reward_server.py, in .venv-triton), each serving
the tiny world's reward model, a Hugging Face one-label sequence-classification model.

The vLLM command is the one docs/rewards.md gives users (read from the page, so the two cannot drift). Without an
environment the tests that need it skip, unless its RLSTEPS_REQUIRE_* switch (CI sets them) makes that a failure.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from required import unavailable
from rlsteps.engine.rewards.process import LocalServer
from rlsteps.engine.rewards.rm.apis import NEMO_ALIGNER_MODEL
from vllm_judge import VLLM_SERVER, vllm_python

REPO = Path(__file__).resolve().parent.parent
REWARDS_PAGE = REPO / "docs" / "rewards.md"
VLLM_REWARD_NAME = "tiny-reward-model"


def triton_python() -> Path:
    """The interpreter of PyTriton's environment: $RLSTEPS_TRITON_PYTHON, else .venv-triton in the repository."""
    python = Path(os.environ.get("RLSTEPS_TRITON_PYTHON") or REPO / ".venv-triton" / "bin" / "python")
    if not python.is_file():
        unavailable(f"no PyTriton environment at {python}: run bash tests/make_triton_env.sh", switch="TRITON")
    return python


def documented_vllm_options() -> list[str]:
    """The options of the `vllm serve` command docs/rewards.md gives for a reward model (its model and port aside)."""
    commands = re.findall(r"^vllm serve (\S+) (.*)$", REWARDS_PAGE.read_text(), flags=re.MULTILINE)
    assert len(commands) == 1, f"docs/rewards.md should give one `vllm serve` command, found {commands}"
    options = shlex.split(commands[0][1])
    port = options.index("--port")
    return options[:port] + options[port + 2 :]


@contextmanager
def vllm_reward_server(model: Path, log_path: Path) -> Iterator[str]:
    """vLLM's OpenAI server, started as docs/rewards.md says, on loopback; yields its base URL. `--enforce-eager`:
    a model this small gains nothing from compiling, and starts in a fraction of the time."""
    args = ["--model", str(model), *documented_vllm_options(), "--served-model-name", VLLM_REWARD_NAME]
    args += ["--dtype", "float32", "--enforce-eager"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    server = LocalServer(VLLM_SERVER, args, log_path=log_path, env=env, startup_timeout_s=900, python=vllm_python())
    with server:
        yield server.url


@contextmanager
def nemo_aligner_reward_server(model: Path, log_path: Path) -> Iterator[str]:
    """tests/triton_reward_server.py (PyTriton under NeMo-Aligner's names) on loopback; yields its base URL once the
    model is ready (Triton's own readiness, GET /v2/models/<name>/ready)."""
    server = LocalServer(
        "triton_reward_server",
        ["--model", str(model)],
        log_path=log_path,
        env={"PYTHONPATH": str(REPO / "tests")},
        startup_timeout_s=300,
        health_path=f"/v2/models/{NEMO_ALIGNER_MODEL}/ready",
        python=triton_python(),
    )
    with server:
        yield server.url
