"""`rlsteps serve rm|judge`: the servers' own commands, the ones `python -m rlsteps.engine.rewards.rm|judge` runs."""

from __future__ import annotations

import typer

from rlsteps.engine.rewards.judge.command import serve_judge
from rlsteps.engine.rewards.rm.command import serve_reward_model

serve_app = typer.Typer(rich_markup_mode=None, no_args_is_help=True, help="Serve a reward model or a judge over HTTP.")
serve_app.command("rm")(serve_reward_model)
serve_app.command("judge")(serve_judge)
