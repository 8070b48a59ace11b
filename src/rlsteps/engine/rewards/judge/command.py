"""The tiny judge server's command: `rlsteps serve judge` and `python -m rlsteps.engine.rewards.judge`."""

from __future__ import annotations

import typer

from rlsteps.engine.rewards.serve_command import (
    DEVICE_HELP,
    HOST_HELP,
    TOKEN_ENV_HELP,
    run_as_program,
    server_setup,
)


def serve_judge(
    model: str = typer.Option(..., "--model", help="A scalar reward model directory to judge with."),
    host: str = typer.Option("127.0.0.1", "--host", help=HOST_HELP),
    port: int = typer.Option(8000, "--port"),
    model_name: str = typer.Option(
        "tiny-judge", "--model-name", help="The model name clients send and /v1/models lists."
    ),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    token_env: str | None = typer.Option(None, "--token-env", metavar="VAR", help=TOKEN_ENV_HELP),
) -> None:
    """Serve an OpenAI-compatible judge: POST /v1/chat/completions answering the judge's JSON protocol."""
    token = server_setup(token_env)
    from rlsteps.engine.rewards.judge.server import serve

    serve(model, host, port, model_name, token, device=device)


def main(argv: list[str] | None = None) -> None:
    run_as_program(serve_judge, "python -m rlsteps.engine.rewards.judge", argv)
