"""The reward-model server's command: `rlsteps serve rm` and `python -m rlsteps.engine.rewards.rm`."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from rlsteps.engine.rewards.serve_command import (
    Device,
    Host,
    Port,
    Threads,
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
    dtype: Annotated[
        Literal["auto", "float32", "bfloat16", "float16"],
        typer.Option(help="The weights' dtype; auto: the one the checkpoint stores."),
    ] = "auto",
    max_length: Annotated[
        int, typer.Option(help="Tokens per pair, and the most a request may ask for with its max_length.")
    ] = 512,
    truncation_side: Annotated[
        Literal["left", "right"],
        typer.Option(help="Where a longer pair is cut unless its request says: left keeps the end (the response)."),
    ] = "left",
    batch_size: Annotated[int, typer.Option(help="Rows per forward pass.")] = 32,
    max_batch: Annotated[int, typer.Option(help="Most pairs scored together.")] = 64,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits to fill after its first pair.")] = 5.0,
    max_batch_tokens: Annotated[
        int | None,
        typer.Option(help="Most tokens scored together (estimated); default --max-batch x --max-length / 4."),
    ] = None,
    max_queue: Annotated[
        int | None,
        typer.Option(
            help="Pairs waiting before new requests get 503 with Retry-After; "
            "default: 4 x --max-batch, or the pairs scored in 1 s if more."
        ),
    ] = None,
    max_request_mb: Annotated[float, typer.Option(help="Largest request body; a larger one gets 413.")] = 8.0,
    threads: Threads = None,
    token_env: TokenEnv = None,
) -> None:
    """Serve a scalar reward model: POST /v1/rewards, GET /health."""
    token = server_setup(token_env, threads)
    from rlsteps.engine.rewards.rm.server import serve

    batching = {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_queue": max_queue}
    batching |= {"max_batch_tokens": max_batch_tokens, "max_request_mb": max_request_mb}
    serve(
        model, host, port, device=device, dtype=dtype, max_length=max_length, truncation_side=truncation_side,
        batch_size=batch_size, token=token, **batching,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    run_as_program(serve_reward_model, "python -m rlsteps.engine.rewards.rm", argv)
