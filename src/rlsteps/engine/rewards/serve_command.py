"""What both command lines of a server share: `rlsteps serve rm|judge` and `python -m rlsteps.engine.rewards.rm|judge`
run the same typer command (rm/command.py, judge/command.py), so their options cannot drift.

Torch-free: `rlsteps --help` imports the commands; each imports its server only when it runs.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from rlsteps.engine.rewards.auth import token_from_env

# The options both servers take, declared once (each command gives its own default port).
Host = Annotated[str, typer.Option("--host", help="Address to bind; loopback by default.")]
Port = Annotated[int, typer.Option("--port", help="Port to listen on.")]
Device = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N (auto: the GPU when there is one).")]
TokenEnv = Annotated[
    str | None,
    typer.Option("--token-env", metavar="VAR", help="Environment variable holding the bearer token (never the token)."),
]


def server_setup(token_env: str | None) -> str | None:
    """A server's token from --token-env (a usage error when that variable is unset) and its log on stderr."""
    try:
        token = token_from_env(token_env)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None  # the message names --token-env and the variable
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return token


def run_as_program(command: Callable[..., Any], prog: str, argv: list[str] | None = None) -> None:
    """Run one server command as a program of its own (`python -m ...`)."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(command)
    app(args=argv, prog_name=prog)
