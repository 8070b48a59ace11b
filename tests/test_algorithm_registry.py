"""The algorithms are registered once (rlsteps.contract.algorithms): the schemas, the engine, the manifests and the
NeMo-RL compile read that table, and a fourth algorithm registered in a test is refused by name on every path that
does not support it, never run as another."""

import importlib
import tomllib
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pytest

from rlsteps.contract import algorithms
from rlsteps.contract.algorithms import ALGORITHMS, Algorithm, NemoRlForm, UnsupportedAlgorithm, nemo_rl_form
from rlsteps.contract.config import RECIPE_SCHEMAS, STEP_SCHEMAS
from rlsteps.contract.eval_config import EvalConfig  # noqa: F401  registers eval/policy in STEP_SCHEMAS

ROOT = Path(__file__).resolve().parents[1]
FOURTH = Algorithm("ppo", "rlsteps.engine.algorithms.ppo:PPO")  # no maths, no schema, no NeMo-RL form


@pytest.fixture
def fourth_registered(monkeypatch):
    monkeypatch.setitem(ALGORITHMS, FOURTH.name, FOURTH)
    return FOURTH


def test_the_registry_the_schemas_and_the_manifests_name_the_same_algorithms():
    assert list(ALGORITHMS) == list(RECIPE_SCHEMAS)
    manifests = [tomllib.loads(p.read_text()) for p in (ROOT / "manifests").rglob("*.toml") if p.name != "types.toml"]
    named = {manifest["step"]["algorithm"] for manifest in manifests}
    assert named - set(STEP_SCHEMAS) == set()  # every manifest's algorithm has a schema
    assert set(ALGORITHMS) <= named  # every registered algorithm has a step


def test_each_registered_algorithm_names_its_engine_recipe():
    from rlsteps.engine.algorithms.recipe import Recipe

    for entry in ALGORITHMS.values():
        module, _, name = entry.engine_class.partition(":")
        assert issubclass(getattr(importlib.import_module(module), name), Recipe), entry


def test_nemo_rl_runs_what_the_registry_says_it_runs():
    assert nemo_rl_form("grpo").judge and not nemo_rl_form("reinforce").judge
    assert nemo_rl_form("nemo_rl_grpo").driver == nemo_rl_form("grpo").driver
    with pytest.raises(UnsupportedAlgorithm, match=r"engine=nemo_rl does not run algorithm 'rs'.*engine=embedded"):
        nemo_rl_form("rs")


def test_a_fourth_algorithm_is_refused_by_name_by_the_nemo_rl_compile(fourth_registered):
    from rlsteps.nemo_rl.environments import NemoRlConfigError
    from rlsteps.nemo_rl.key_map import pairs
    from rlsteps.nemo_rl.master_config import compile_master_config

    with pytest.raises(NemoRlConfigError, match=r"does not run algorithm 'ppo' \(NeMo-RL's job runs reinforce, grpo"):
        compile_master_config({"algorithm": "ppo"}, None, PurePosixPath("/runs/a"))
    with pytest.raises(UnsupportedAlgorithm, match="'ppo'"):
        pairs("ppo")


def test_a_fourth_algorithm_on_nemo_rl_without_key_pairs_is_refused(monkeypatch):
    from rlsteps.nemo_rl.key_map import pairs

    monkeypatch.setitem(
        ALGORITHMS, "ppo", Algorithm("ppo", FOURTH.engine_class, NemoRlForm("examples/run_ppo.py", False))
    )
    with pytest.raises(UnsupportedAlgorithm, match="'ppo' runs on NeMo-RL but has no key pairs"):
        pairs("ppo")


def test_a_fourth_algorithm_is_refused_by_name_by_the_nemo_rl_job(fourth_registered, tmp_path):
    from rlsteps.engine.nemo_rl_stages.data import write_rows
    from rlsteps.launch.ray_job import driver_words

    job = SimpleNamespace(config={"algorithm": "ppo", "nemo_rl_job": {"python": "python", "driver": None}})
    with pytest.raises(UnsupportedAlgorithm, match="'ppo'"):
        driver_words(job, SimpleNamespace(job_dir=PurePosixPath("/jobs/a")))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say hi."}\n')
    with pytest.raises(UnsupportedAlgorithm, match="'ppo'"):
        write_rows(str(prompts), tmp_path / "rows.jsonl", "ppo", "agent")


def test_an_unregistered_algorithm_is_named_with_those_that_are():
    with pytest.raises(
        UnsupportedAlgorithm, match="no algorithm 'dpo' is registered; rlsteps runs rs, reinforce, grpo"
    ):
        algorithms.algorithm("dpo")


def test_a_fourth_algorithm_without_maths_is_refused_by_name_by_the_engine(fourth_registered):
    from rlsteps.engine.algorithms import RECIPES, recipe_class

    assert set(RECIPES) == {"rs", "reinforce", "grpo"}
    with pytest.raises(UnsupportedAlgorithm, match=r"'ppo' is registered with rlsteps.engine.algorithms.ppo:PPO, wh"):
        recipe_class("ppo")


def test_a_fourth_algorithm_without_a_schema_is_refused_by_name_by_the_compile(fourth_registered):
    from rlsteps.errors import UsageError
    from rlsteps.plan.compile import _validate

    step = SimpleNamespace(id="rl/ppo", algorithm="ppo")  # a manifest's step naming it
    with pytest.raises(UsageError, match=r"rl/ppo: no config schema for algorithm 'ppo'"):
        _validate(step, {"algorithm": "ppo"})


def test_a_fourth_algorithm_has_no_notes_on_how_nemo_rl_runs_it(fourth_registered):
    from rlsteps.nemo_rl.semantics import differences

    with pytest.raises(UnsupportedAlgorithm, match="no notes on how NeMo-RL runs algorithm 'ppo'"):
        differences({"algorithm": "ppo", "train": {"max_epochs": 1}, "validation": {"reward_functions": {}},
                     "checkpoint": {"keep_last": 1, "keep_top_k": 1}})  # fmt: skip
