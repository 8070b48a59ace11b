"""The reward-model server's command: `rlsteps serve rm` and `python -m rlsteps.engine.rewards.rm`."""

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
    str,
    typer.Option(
        "--model", callback=reward_model_folder, help="A Hugging Face sequence-classification reward model directory."
    ),
]


def serve_reward_model(
    model: Model,
    host: Host = "127.0.0.1",
    port: Port = 5555,
    device: Device = "auto",
    max_length: Annotated[int, typer.Option(help="Tokens per input; longer inputs keep their end.")] = 512,
    batch_size: Annotated[int, typer.Option(help="Rows per forward pass.")] = 32,
    max_batch: Annotated[int, typer.Option(help="Most inputs scored together.")] = 64,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits to fill after its first input.")] = 5.0,
    max_queue: Annotated[int, typer.Option(help="Inputs queued before answering 503.")] = 1024,
    token_env: TokenEnv = None,
) -> None:
    """Serve a scalar reward model: POST /v1/rewards, GET /health."""
    token = server_setup(token_env)
    from rlsteps.engine.rewards.rm.server import serve

    batching = {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_queue": max_queue}
    serve(model, host, port, device=device, max_length=max_length, batch_size=batch_size, token=token, **batching)


def main(argv: list[str] | None = None) -> None:
    run_as_program(serve_reward_model, "python -m rlsteps.engine.rewards.rm", argv)
