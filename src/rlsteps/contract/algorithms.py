"""The algorithms rlsteps runs, each registered once: its name (a manifest's and a config's `algorithm`), the engine
class of its maths, and how NeMo-RL runs it, or that it does not.

The engine builds its recipe from `engine_class` (rlsteps.engine.algorithms), the NeMo-RL compile and its job read
`nemo_rl` (rlsteps.nemo_rl, rlsteps.launch.ray_job), and the config schemas are checked against this table
(contract.config.RECIPE_SCHEMAS). A path an algorithm has no entry for refuses it by name, never runs it as another.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

NEMO_GYM_DRIVER = "examples/nemo_gym/run_grpo_nemo_gym.py"  # GRPO with NeMo-Gym's environments (the judge)


class UnsupportedAlgorithm(ValueError):
    """An algorithm a path does not run: its message names the algorithm and those the path runs."""


@dataclass(frozen=True)
class NemoRlForm:
    """How NeMo-RL runs an algorithm: its training script, and whether the rewards come from NeMo-Gym's judge
    (genrm_compare) or from a reward model's environment."""

    driver: str  # relative to NeMo-RL's checkout
    judge: bool


@dataclass(frozen=True)
class Algorithm:
    name: str
    engine_class: str  # "module:Class": the recipe the embedded engine builds (rlsteps.engine.algorithms.recipe)
    nemo_rl: NemoRlForm | None = None  # None: engine=nemo_rl refuses it


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("rs", "rlsteps.engine.algorithms.rs:RejectionSampling"),
        Algorithm(
            "reinforce",
            "rlsteps.engine.algorithms.reinforce:ReinforceRLOO",
            NemoRlForm("examples/run_grpo.py", judge=False),
        ),
        Algorithm("grpo", "rlsteps.engine.algorithms.grpo:GRPO", NemoRlForm(NEMO_GYM_DRIVER, judge=True)),
    )
}
# rl/nemo_rl/rlhf: a NeMo-RL config as written, run by NeMo-RL's own driver (or mapped onto grpo where none runs)
NEMO_RL_AS_WRITTEN = "nemo_rl_grpo"
NEMO_RL_AS_WRITTEN_FORM = NemoRlForm(NEMO_GYM_DRIVER, judge=True)


def algorithm(name: str) -> Algorithm:
    """The registered algorithm of this name."""
    found = ALGORITHMS.get(name)
    if found is None:
        raise UnsupportedAlgorithm(f"no algorithm '{name}' is registered; rlsteps runs {', '.join(ALGORITHMS)}")
    return found


def nemo_rl_form(name: str) -> NemoRlForm:
    """How NeMo-RL runs this algorithm (rl/nemo_rl/rlhf's config as written included)."""
    if name == NEMO_RL_AS_WRITTEN:
        return NEMO_RL_AS_WRITTEN_FORM
    form = algorithm(name).nemo_rl
    if form is None:
        runs = ", ".join(a.name for a in ALGORITHMS.values() if a.nemo_rl is not None)
        raise UnsupportedAlgorithm(
            f"engine=nemo_rl does not run algorithm '{name}' (NeMo-RL's job runs {runs} and rl/nemo_rl/rlhf): "
            "run it with engine=embedded"
        )
    return form
