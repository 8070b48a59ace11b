"""The tiny judge server's command: `rlsteps serve judge` and `python -m rlsteps.engine.rewards.judge`."""

from __future__ import annotations

from typing import Annotated

import typer

from rlsteps.engine.rewards.serve_command import (
    Device,
    Host,
    Port,
    TokenEnv,
    reward_model_folder,
    run_as_program,
    server_setup,
)

Model = Annotated[
    str, typer.Option("--model", callback=reward_model_folder, help="A scalar reward model directory to judge with.")
]
ModelName = Annotated[str, typer.Option("--model-name", help="The model name clients send and /v1/models lists.")]


def serve_judge(
    model: Model,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    model_name: ModelName = "tiny-judge",
    device: Device = "auto",
    token_env: TokenEnv = None,
) -> None:
    """Serve an OpenAI-compatible judge: POST /v1/chat/completions answering the judge's JSON protocol."""
    token = server_setup(token_env)
    from rlsteps.engine.rewards.judge.server import serve

    serve(model, host, port, model_name, token, device=device)


def main(argv: list[str] | None = None) -> None:
    run_as_program(serve_judge, "python -m rlsteps.engine.rewards.judge", argv)
