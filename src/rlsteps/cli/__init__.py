"""The command line: the typer app (app), its command groups (jobs, pipelines, artifacts) and rendering.

It parses, calls the plan layer and prints; it holds no logic of its own.
"""

from rlsteps.cli.app import app, entry, main

__all__ = ["app", "entry", "main"]
