"""The tiny judge server's command: `rlsteps serve judge` and `python -m rlsteps.engine.rewards.judge`."""

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
    str, typer.Option("--model", callback=reward_model_folder, help="A scalar reward model directory to judge with.")
]
ModelName = Annotated[str, typer.Option("--model-name", help="The model name clients send and /v1/models lists.")]


def _positive_scale(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value:g} is not above 0: the scale divides the rewards")
    return value


def serve_judge(
    model: Model,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    model_name: ModelName = "tiny-judge",
    device: Device = "auto",
    dtype: Annotated[
        Literal["auto", "float32", "bfloat16", "float16"],
        typer.Option(help="The weights' dtype; auto: the one the checkpoint stores."),
    ] = "auto",
    max_length: Annotated[
        int, typer.Option(help="Tokens kept of each conversation and response (cut on the left).")
    ] = 512,
    batch_size: Annotated[int, typer.Option(help="Rows per forward pass (at most two a comparison).")] = 128,
    max_batch: Annotated[int, typer.Option(help="Most comparisons scored together.")] = 64,
    max_wait_ms: Annotated[
        float, typer.Option(help="How long a batch waits to fill after its oldest comparison arrived.")
    ] = 2.0,
    max_queue: Annotated[
        int | None,
        typer.Option(help="Comparisons waiting before new ones get 503 with Retry-After; default: 4 x --max-batch."),
    ] = None,
    threads: Threads = None,
    token_env: TokenEnv = None,
    center: Annotated[
        float | None,
        typer.Option(help="The reward read as score 3 of 5; default: the model's own (config.json), else 0."),
    ] = None,
    scale: Annotated[
        float | None,
        typer.Option(
            callback=_positive_scale,
            help="Rewards this far apart move a score by about one point; default: the model's own, else 2.",
        ),
    ] = None,
) -> None:
    """Serve an OpenAI-compatible judge: POST /v1/chat/completions answering the judge's JSON protocol."""
    token = server_setup(token_env, threads)
    from rlsteps.engine.rewards.judge.server import serve

    serve(
        model, host, port, model_name, token, device=device, dtype=dtype, max_length=max_length,
        batch_size=batch_size, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, center=center,
        scale=scale,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    run_as_program(serve_judge, "python -m rlsteps.engine.rewards.judge", argv)
