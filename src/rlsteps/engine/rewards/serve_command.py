"""What both command lines of a server share: `rlsteps serve rm|judge` and `python -m rlsteps.engine.rewards.rm|judge`
run the same typer command (rm/command.py, judge/command.py), so their options cannot drift.

Torch-free: `rlsteps --help` imports the commands; each imports its server only when it runs, after its model folder
was checked (reward_model_folder), so a wrong path or kind is one line, not a loader's traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from rlsteps.engine.rewards.auth import token_from_env

# The options both servers take, declared once (each command gives its own default port).
Host = Annotated[str, typer.Option("--host", help="Address to bind; loopback by default.")]
Port = Annotated[int, typer.Option("--port", help="Port to listen on.")]
Device = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N (auto: the GPU when there is one).")]
Threads = Annotated[
    int | None, typer.Option("--threads", min=1, help="torch's CPU threads; default: torch's own (one a core).")
]
TokenEnv = Annotated[
    str | None,
    typer.Option("--token-env", metavar="VAR", help="Environment variable holding the bearer token (never the token)."),
]


def server_setup(token_env: str | None, threads: int | None = None) -> str | None:
    """A server's token from --token-env (a usage error when that variable is unset), its log on stderr, and its
    torch threads (--threads: set before the model loads; torch's default takes every core)."""
    try:
        token = token_from_env(token_env)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None  # the message names --token-env and the variable
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if threads:
        import torch  # here, not at the top: `rlsteps serve --help` imports no torch

        torch.set_num_threads(threads)
    return token


def reward_model_folder(path: str) -> str:
    """`path` when it holds a Hugging Face reward model (a ...ForSequenceClassification), else a one-line usage
    error with the fix, before anything is loaded."""
    folder = Path(path)
    if not folder.is_dir():
        raise typer.BadParameter(f"{path} is not a folder: pass the folder of a Hugging Face reward model")
    try:
        architectures = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        raise typer.BadParameter(f"{path} has no readable config.json: it is not a Hugging Face model folder") from None
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        held = ", ".join(map(str, architectures)) or "a model without architectures"
        raise typer.BadParameter(
            f"{path} holds {held}, not a reward model (a ...ForSequenceClassification with one label); "
            "a causal LM judges through an OpenAI-compatible server such as vLLM (judge.url)"
        )
    return path


def run_as_program(command: Callable[..., Any], prog: str, argv: list[str] | None = None) -> None:
    """Run one server command as a program of its own (`python -m ...`)."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(command)
    app(args=argv, prog_name=prog)
