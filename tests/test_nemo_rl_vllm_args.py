"""The keywords a NeMo-RL job hands to vLLM, held to vLLM's own classes (its CPU build in .venv-vllm): the argument
names rlsteps checks at compile time (rlsteps.nemo_rl.vllm_fields) are the installed vLLM's, the compiled configs'
keywords construct vLLM's AsyncEngineArgs as NeMo-RL's worker composes them, and what the compile refuses is what
vLLM refuses (or, for the judge's server, what its argument parser keeps without a word)."""

import ast
import json
import subprocess

import pytest
import yaml

import upstream
from rlsteps.contract.nemo_rl_job import MASTER_CONFIG_FILE
from rlsteps.errors import UsageError
from rlsteps.nemo_rl import vllm_fields
from rlsteps.nemo_rl.vllm_args import NEMO_RL_KEYWORDS
from test_nemo_rl_runs import (
    GPU_PROFILES,
    REINFORCE_INPUTS,
    RLHF_INPUTS,
    SEED,
    SEED_INPUTS,
    compile_case,
    project_with_profiles,
)
from vllm_judge import vllm_python

pytestmark = pytest.mark.slow  # vLLM's environment, in a process of its own

SERVE = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.vllm_serve_kwargs"
# vLLM's side: its names, AsyncEngineArgs built from each set of engine keywords, and each judge's vllm_serve_kwargs
# through vLLM's server parser into its engine arguments; "model" is a local folder (vLLM resolves it at once)
VLLM_SIDE = r"""
import dataclasses, json, sys
from argparse import Namespace
import vllm
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

def said(call):
    try:
        call()
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "ok"

def serve(kwargs):  # as NeMo-Gym's local_vllm_model parses vllm_serve_kwargs (model: the judge, set by Gym)
    kwargs = {**kwargs, "model": asked["model"]}
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(args=[], namespace=Namespace(**kwargs))
    engine = AsyncEngineArgs.from_cli_args(args)
    return {key: getattr(engine, key, "(dropped)") for key in kwargs if key != "model"}

asked = json.load(sys.stdin)
parser = make_arg_parser(FlexibleArgumentParser())
print(json.dumps({
    "version": vllm.__version__,
    "engine_args": sorted(f.name for f in dataclasses.fields(AsyncEngineArgs)),
    "serve_dests": sorted({a.dest for a in parser._actions if a.dest != "help"}),
    "engines": {name: said(lambda: AsyncEngineArgs(**{**kwargs, "model": asked["model"]}))
                for name, kwargs in asked["engines"].items()},
    "serves": {name: serve(kwargs) for name, kwargs in asked["serves"].items()},
}))
"""
COMPILED = {  # name: (step, config, profile, overrides): compiled configs whose keywords vLLM must take
    "seed page": (SEED, "default", "two_nodes", SEED_INPUTS),
    "seed page, vllm_kwargs": (SEED, "default", "two_nodes", (*SEED_INPUTS,
        "policy.generation.vllm_kwargs.max_num_seqs=64", "policy.generation.vllm_kwargs.enable_chunked_prefill=true",
        f"{SERVE}.max_num_seqs=32")),
    "rl/rlhf": ("rl/rlhf", "default", "two_nodes", RLHF_INPUTS),
    "rl/reinforce": ("rl/reinforce", "default", "two_nodes", REINFORCE_INPUTS),
}  # fmt: skip
TYPO = (SEED, "default", "two_nodes", (*SEED_INPUTS, "policy.generation.vllm_kwargs.max_num_seqz=4"))
JUDGE_TYPO = (SEED, "default", "two_nodes", (*SEED_INPUTS, f"{SERVE}.max_num_seqz=8"))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    yield from project_with_profiles(tmp_path_factory.mktemp("nemo_rl_vllm_args"), GPU_PROFILES)


def master_of(case: tuple) -> dict:
    return yaml.safe_load(compile_case(*case).plan.files[MASTER_CONFIG_FILE])


def engine_keywords(master: dict) -> dict:
    """The keywords NeMo-RL's vLLM worker gives vLLM for this master config (vllm_worker.py's llm_kwargs: its own,
    then policy.generation.vllm_kwargs, with the executor and hf_overrides it sets there)."""
    vllm_cfg = master["policy"]["generation"]["vllm_cfg"]
    own = {
        "model": master["policy"]["model_name"],
        "served_model_name": master["policy"]["model_name"],
        "load_format": "dummy",
        "skip_tokenizer_init": False,
        "tensor_parallel_size": vllm_cfg["tensor_parallel_size"],
        "pipeline_parallel_size": vllm_cfg["pipeline_parallel_size"],
        "enable_expert_parallel": vllm_cfg["expert_parallel_size"] > 1,
        "gpu_memory_utilization": vllm_cfg["gpu_memory_utilization"],
        "enable_prefix_caching": True,
        "dtype": vllm_cfg["precision"],
        "seed": master["grpo"]["seed"],
        "enforce_eager": vllm_cfg["enforce_eager"],
        "max_model_len": vllm_cfg["max_model_len"],
        "trust_remote_code": True,
        "worker_extension_cls": "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension",
        "enable_sleep_mode": True,
        "disable_log_stats": False,
        "logprobs_mode": "processed_logprobs",
    }
    assert set(own) == set(NEMO_RL_KEYWORDS)
    given = {"distributed_executor_backend": None, "hf_overrides": {}, **master["policy"]["generation"]["vllm_kwargs"]}
    return {**own, **given}


def serve_keywords(master: dict) -> dict:
    server = master["env"]["nemo_gym"]["genrm_model"]["responses_api_models"]["genrm_model"]
    return dict(server["vllm_serve_kwargs"])


def refused_and_fixed(case: tuple) -> tuple[UsageError, dict]:
    with pytest.raises(UsageError) as caught:
        compile_case(*case)
    step, config, profile, overrides = case
    return caught.value, master_of((step, config, profile, (*overrides, *caught.value.fix.split())))


@pytest.fixture(scope="module")
def vllm_says(project, tiny_world):
    """vLLM's own answers: its argument names, and its classes run on the compiled and the refused keywords."""
    masters = {name: master_of(case) for name, case in COMPILED.items()}
    typo, typo_fixed = refused_and_fixed(TYPO)
    judge_typo, judge_fixed = refused_and_fixed(JUDGE_TYPO)
    engines = {name: engine_keywords(master) for name, master in masters.items()}
    engines["typo, fixed"] = engine_keywords(typo_fixed)
    engines["typo, as asked"] = {**engine_keywords(typo_fixed), "max_num_seqz": 4}
    serves = {"judge": serve_keywords(masters["seed page, vllm_kwargs"]), "judge typo, fixed": serve_keywords(
        judge_fixed), "judge typo, as asked": {**serve_keywords(judge_fixed), "max_num_seqz": 8}}  # fmt: skip
    asked = json.dumps({"engines": engines, "serves": serves, "model": str(tiny_world.policy)})
    done = subprocess.run([str(vllm_python()), "-c", VLLM_SIDE], input=asked, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return {"refused": {"typo": typo, "judge typo": judge_typo}, **json.loads(done.stdout.splitlines()[-1])}


def test_the_checked_in_names_are_the_installed_vllms(vllm_says):
    assert vllm_says["version"] == vllm_fields.VLLM_VERSION
    assert sorted(vllm_fields.ENGINE_ARGS) == vllm_says["engine_args"]
    assert sorted(vllm_fields.SERVE_ARGS) == sorted(set(vllm_says["serve_dests"]) - vllm_fields.ENGINE_ARGS)


def test_nemo_rls_own_keywords_are_those_its_vllm_worker_passes():
    source = (upstream.unpacked("nemo_rl") / "nemo_rl/models/generation/vllm/vllm_worker.py").read_text()
    calls = [node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Assign)
             and any(getattr(target, "id", "") == "llm_kwargs" for target in node.targets)
             and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "dict"]  # fmt: skip
    (call,) = calls
    assert {keyword.arg for keyword in call.keywords if keyword.arg} == set(NEMO_RL_KEYWORDS)


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_vllm_takes_the_keywords_of_every_compiled_config(vllm_says, name):
    assert vllm_says["engines"][name] == "ok"


def test_an_unknown_engine_keyword_is_refused_with_vllms_own_name_and_vllm_refuses_it(vllm_says):
    error = vllm_says["refused"]["typo"]
    assert "max_num_seqz is not an argument of vLLM" in error.message and "did you mean max_num_seqs" in error.message
    assert error.fix == "policy.generation.vllm_kwargs.max_num_seqz=null policy.generation.vllm_kwargs.max_num_seqs=4"
    assert vllm_says["engines"]["typo, fixed"] == "ok"
    assert "unexpected keyword argument 'max_num_seqz'" in vllm_says["engines"]["typo, as asked"]


def test_a_judge_server_keyword_vllm_would_lose_is_refused_and_the_fix_reaches_vllms_engine(vllm_says):
    error = vllm_says["refused"]["judge typo"]
    assert "max_num_seqz is not an argument of vLLM" in error.message
    assert error.fix == f"{SERVE}.max_num_seqz=null {SERVE}.max_num_seqs=8"
    assert vllm_says["serves"]["judge typo, fixed"]["max_num_seqs"] == 8
    assert vllm_says["serves"]["judge typo, as asked"]["max_num_seqz"] == "(dropped)"  # vLLM keeps no such setting
    assert vllm_says["serves"]["judge"]["max_num_seqs"] == 32


def test_a_keyword_nemo_rl_passes_itself_is_refused(project):
    with pytest.raises(UsageError) as caught:
        compile_case(SEED, "default", "two_nodes", (*SEED_INPUTS, "policy.generation.vllm_kwargs.max_model_len=8"))
    assert "passes max_model_len to vLLM itself" in caught.value.message
    assert caught.value.fix == "policy.generation.vllm_kwargs.max_model_len=null"
