"""rlsteps from Python (a notebook, a script): run a step with overrides and rewards that are Python callables, then
read what it wrote.

    import rlsteps

    def brevity(messages, response):  # a reward: the conversation, the response, and the prompt's fields by name
        return -len(response.split()) / 10

    run = rlsteps.run("rl/reinforce", config="tiny", overrides={"train.max_steps": 4}, rewards={"brevity": brevity})
    run.series("reward/brevity")       # ([1, 2, 3, 4], [...]): a metric by step
    run.output                         # the policy it wrote (a checkpoint_megatron or checkpoint_hf folder)

The step is compiled and checked as `rlsteps run` compiles and checks it (the same refusals, the same job directory
and records), then runs in this process, so a reward may be any callable, a function defined in the notebook or a
closure. A run that fails raises the error the command line would print; a rerun resumes from its checkpoint.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsteps.contract.run_files import METRICS_FILE, TRAIN_LOG, correct_it, read_metrics, run_directory, then_rerun
from rlsteps.errors import RunFailed, UsageError

REWARDS_MODULE = "rlsteps.api_rewards"  # where the callables given to run() are found by the worker's loader
SAMPLES_FILE = "samples.jsonl"
OUTPUT_NAME = "policy"

Reward = Callable[..., Any]


@dataclass(frozen=True)
class Run:
    """A finished run: where it wrote, and its records read back."""

    step: str
    run_dir: Path
    job_dir: Path

    @property
    def output(self) -> Path:
        """The output artifact, <output.dir>/policy."""
        return self.run_dir / OUTPUT_NAME

    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl: one record a step (and one at step 0, the validation before training)."""
        return read_metrics(self.run_dir / METRICS_FILE)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, over the records that have it."""
        rows = [row for row in self.metrics() if key in row]
        return [int(row["step"]) for row in rows], [float(row[key]) for row in rows]

    def samples(self) -> list[dict[str, Any]]:
        """samples.jsonl: what the policy said, with its rewards."""
        path = self.run_dir / SAMPLES_FILE
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def run(
    step: str,
    config: str = "tiny",
    overrides: Mapping[str, Any] | None = None,
    rewards: Mapping[str, Reward | tuple[Reward, float]] | None = None,
    say: Callable[[str], None] = print,
) -> Run:
    """Run a step here, in this process, to its end.

    overrides: config keys and values, as `key=value` on the command line takes them ({"train.lr": 1e-5}).
    rewards: name -> a callable (weight 1) or (callable, weight): each a reward term `rewards.<name>` beside the
    config's own, called as a `module:function` reward is (rlsteps.engine.rewards.functions). A name the config
    has already (rewards.reward_model, ...) is replaced; set it to None in overrides to drop a term.
    """
    from rlsteps.catalog import load_catalog
    from rlsteps.plan.runner import RunRequest, compile_request, prepare

    dotlist = [*_as_dotlist(overrides or {}), *_reward_overrides(rewards or {})]
    catalog = load_catalog()
    request = RunRequest(step=step, config=config, overrides=tuple(dotlist), argv=("rlsteps.run", step, *dotlist))
    compiled = compile_request(catalog, request, say)
    if compiled.job.executor != "local":
        raise UsageError(f"rlsteps.run runs a step here; {step} is compiled for {compiled.job.executor}")
    job_dir, _ = prepare(catalog, compiled, say)
    from rlsteps.engine.run.worker import run_here  # torch and the engine: only now
    from rlsteps.engine.run.worker_log import last_error

    last_error.clear()
    code = run_here(job_dir / "config.yaml")
    run_dir = Path(run_directory(compiled.job.config, Path.cwd()))
    if code:
        cause = last_error.message or f"the run ended without an error line (its log: {run_dir / TRAIN_LOG})"
        fix = last_error.fix or then_rerun(correct_it(run_dir), run_dir, request.argv)
        raise RunFailed(f"{step} failed with exit code {code}: {cause}", fix=fix)
    return Run(step=catalog.find(step).id, run_dir=run_dir, job_dir=job_dir)


def _as_dotlist(overrides: Mapping[str, Any]) -> list[str]:
    """{"train.lr": 1e-5, "a.b": [1, 2], "c": None} -> ["train.lr=1e-05", "a.b=[1, 2]", "c=null"] (YAML values)."""
    return [f"{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in overrides.items()]


def _reward_overrides(rewards: Mapping[str, Reward | tuple[Reward, float]]) -> list[str]:
    """Each callable put where the worker's loader finds it (a module of this process), as rewards.<name>."""
    module = sys.modules.setdefault(REWARDS_MODULE, types.ModuleType(REWARDS_MODULE))
    lines = []
    for name, given in rewards.items():
        function, weight = given if isinstance(given, tuple) else (given, 1.0)
        if not callable(function):
            fix = "pass a function, or (the function, its weight)"
            raise UsageError(f"rewards[{name!r}] is {function!r}, not a callable", fix=fix)
        setattr(module, name, function)  # by the term's name: a rerun with the same arguments resumes its run
        lines += [f"rewards.{name}.function={REWARDS_MODULE}:{name}", f"rewards.{name}.weight={weight}"]
    return lines
