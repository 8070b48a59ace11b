"""The reward-model server's command: `rlsteps serve rm` and `python -m rlsteps.engine.rewards.rm`."""

from __future__ import annotations

import typer

from rlsteps.engine.rewards.serve_command import (
    DEVICE_HELP,
    HOST_HELP,
    TOKEN_ENV_HELP,
    run_as_program,
    server_setup,
)


def serve_reward_model(
    model: str = typer.Option(..., "--model", help="A Hugging Face sequence-classification reward model directory."),
    host: str = typer.Option("127.0.0.1", "--host", help=HOST_HELP),
    port: int = typer.Option(5555, "--port"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    max_length: int = typer.Option(512, "--max-length", help="Tokens per input; longer inputs keep their end."),
    batch_size: int = typer.Option(32, "--batch-size", help="Rows per forward pass."),
    max_batch: int = typer.Option(64, "--max-batch", help="Most inputs scored together."),
    max_wait_ms: float = typer.Option(
        5.0, "--max-wait-ms", help="How long a batch waits to fill after its first input."
    ),
    max_queue: int = typer.Option(1024, "--max-queue", help="Inputs queued before answering 503."),
    token_env: str | None = typer.Option(None, "--token-env", metavar="VAR", help=TOKEN_ENV_HELP),
) -> None:
    """Serve a scalar reward model: POST /v1/rewards, GET /health."""
    token = server_setup(token_env)
    from rlsteps.engine.rewards.rm.server import serve

    serve(
        model,
        host,
        port,
        device=device,
        max_length=max_length,
        batch_size=batch_size,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        token=token,
    )


def main(argv: list[str] | None = None) -> None:
    run_as_program(serve_reward_model, "python -m rlsteps.engine.rewards.rm", argv)
