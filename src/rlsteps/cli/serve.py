"""`rlsteps serve rm|judge`: the servers' own commands, the ones `python -m rlsteps.engine.rewards.rm|judge` runs, in
the foreground; with -b PROFILE the same server as a Slurm batch job of its own that runs share (`rm.url=job:ID`),
with --dry-run its sbatch script shown and nothing sent (plan.serve_batch). Parses, calls, prints."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console

from rlsteps.cli import terminal
from rlsteps.engine.rewards.judge.command import serve_judge
from rlsteps.engine.rewards.rm.command import serve_reward_model
from rlsteps.errors import UsageError

out = Console()

BatchProfile = Annotated[
    str | None,
    typer.Option(
        "-b", "--batch", metavar="PROFILE", help="Submit the server as a Slurm batch job of its own on this profile."
    ),
]
DryRun = Annotated[bool, typer.Option("-d", "--dry-run", help="With -b: print the batch job's script; send nothing.")]
ForceSquash = Annotated[bool, typer.Option("--force-squash", help="With -b: rebuild the squashed container image.")]
BATCH_ONLY = ("batch_profile", "dry_run", "force_squash")
# the server's options the batch job sets itself (--host: every interface) or carries another way
SET_BY_THE_JOB = ("model", "host", "port", "token_env", *BATCH_ONLY)
GIVEN = ("COMMANDLINE", "ENVIRONMENT")  # click's ParameterSource names of a value the user gave


def batch_or_foreground(serve: Callable[..., None], serves: str) -> Callable[..., None]:
    """The server's command with -b PROFILE, --dry-run and --force-squash added: without -b it runs the server here,
    as `python -m` does; with -b it submits (or shows) the server's batch job. Typer reads the command's options from
    its signature: the server's own, declared once in the engine, and these three."""

    def command(ctx: typer.Context, batch_profile: str | None, dry_run: bool, force_squash: bool, **options: Any):
        if batch_profile is None:
            if dry_run or force_squash:
                raise UsageError("--dry-run and --force-squash are for a batch job", fix="add -b PROFILE")
            serve(**options)
            return
        request = _serve_request(ctx, serves, batch_profile, force_squash, options)
        if dry_run:
            _show(request)
        else:
            _submit(request)

    own = inspect.signature(serve, eval_str=True)
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        for name, annotation, default in (
            ("batch_profile", BatchProfile, None),
            ("dry_run", DryRun, False),
            ("force_squash", ForceSquash, False),
        )
    ]
    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    params = [context, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values()), *extra]
    command.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = (serve.__doc__ or "").rstrip() + (
        f" With -b PROFILE: a Slurm batch job of its own, which runs share ({serves}.url=job:ID)."
    )
    return command


def _serve_request(ctx: typer.Context, serves: str, profile: str, force_squash: bool, options: dict[str, Any]):
    from rlsteps.plan.serve_batch import ServeRequest

    given = {name for name in options if ctx.get_parameter_source(name).name in GIVEN}
    if "host" in given:
        raise UsageError(
            "a shared server listens on every interface of its node: --host is not for -b", fix="drop --host"
        )
    params = {param.name: param for param in ctx.command.params}
    args = []
    for name, value in options.items():
        if name in given and name not in SET_BY_THE_JOB and value is not None:
            args += [params[name].opts[0], str(value)]
    return ServeRequest(
        serves=serves,
        model=options["model"],
        profile=profile,
        port=options["port"] if "port" in given else None,
        default_port=params["port"].default,
        args=tuple(args),
        token=_token(options.get("token_env")),
        force_squash=force_squash,
        argv=tuple((ctx.obj or {}).get("argv", ())),
    )


def _token(variable: str | None) -> str | None:
    """--token-env's value here, which the job gets as a secret; an unset variable is refused as the server does."""
    if variable is None:
        return None
    if not os.environ.get(variable):
        raise UsageError(f"--token-env {variable}: that environment variable is unset or empty", fix="export it first")
    return os.environ[variable]


def _show(request) -> None:
    from rlsteps.cli import render
    from rlsteps.plan.serve_batch import compile_server_job

    compiled = compile_server_job(request)
    job, plan = compiled.job, compiled.plan
    lines = terminal.heading("dry run: nothing was written, started or sent", out.width)
    lines += terminal.key_values(
        [
            ("server", f"rlsteps serve {request.serves} --model {job.config['server']['model']}"),
            ("profile", f"{job.profile_name} ({job.profile_source})"),
            ("job dir", f"{compiled.job_dir} (not created: dry run)"),
            ("launch", plan.summary),
        ],
        out.width,
        2,
    )
    lines += terminal.heading("command", out.width)
    lines += terminal.shell_lines(plan.command, out.width, 2)
    terminal.print_lines(out, lines)
    sys.stdout.write(render.job_files(compiled))


def _submit(request) -> None:
    from rlsteps.launch.server_alloc import URL_KEYS
    from rlsteps.plan.serve_batch import compile_server_job, submit_server_job

    record = submit_server_job(compile_server_job(request))
    key = URL_KEYS[request.serves]
    out.print(
        f"submitted job {record.job_id} ({record.job_dir}): once the server answers, `rlsteps jobs status "
        f"{record.job_id}` shows its address and runs take it with {key}=job:{record.job_id}",
        highlight=False,
        soft_wrap=True,
    )


serve_app = typer.Typer(rich_markup_mode=None, no_args_is_help=True, help="Serve a reward model or a judge over HTTP.")
serve_app.command("rm")(batch_or_foreground(serve_reward_model, "rm"))
serve_app.command("judge")(batch_or_foreground(serve_judge, "judge"))
