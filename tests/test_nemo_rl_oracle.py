"""The NeMo-RL oracle (tests/nemo_rl_oracle.py: NeMo-RL's schema, NeMo-Gym's config parsing, the rows' models) is
sound on NeMo-RL's own example configs, and each of its checks can fail. It judges with NeMo-RL's and NeMo-Gym's own
code, each call in a process of its own. Running NeMo-RL's driver on what rlsteps compiles is
tests/test_nemo_rl_runs.py's."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import rlsteps.nemo_rl as nemo_rl_compiler
import upstream

# Slow (runs NeMo-RL's and NeMo-Gym's own code in processes of their own): the fast tier, -m 'not slow', leaves it out
pytestmark = pytest.mark.slow

NEMO_RL = upstream.unpacked("nemo_rl")  # skips the module without the archives (fails under RLSTEPS_REQUIRE_UPSTREAM=1)
NEMO_GYM = upstream.unpacked("nemo_gym")
STAGE3 = NEMO_RL / "examples/nemo_gym/nemotron-3-super/stage3_rlhf.yaml"
# stage3_rlhf.yaml's third Gym server: its folder is not in the pinned NeMo-Gym archive (which holds genrm_compare
# as its only resources server), so NeMo-Gym's own config loading refuses the file as NeMo-RL ships it.
ABSENT_SERVER = (
    "resources_servers/single_step_tool_use_with_argument_comparison/configs/"
    "single_step_tool_use_with_argument_comparison.yaml"
)


@pytest.fixture(scope="module")
def math_1b() -> dict:
    return upstream.load_nemo_rl_config(NEMO_RL / "examples/configs/grpo_math_1B.yaml")


@pytest.fixture(scope="module")
def stage3() -> dict:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PERSISTENT_CACHE", "/persistent")  # its one ${oc.env:...}: env.nemo_gym.uv_venv_dir
        return upstream.load_nemo_rl_config(STAGE3)


@pytest.fixture(scope="module")
def stage3_in_pinned_gym(stage3) -> dict:
    config = copy.deepcopy(stage3)
    paths = config["env"]["nemo_gym"]["config_paths"]
    config["env"]["nemo_gym"]["config_paths"] = [p for p in paths if p != ABSENT_SERVER]
    return config


def drop(config: dict, *dotted: str) -> dict:
    config = copy.deepcopy(config)
    for key in dotted:
        *parents, last = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        del node[last]
    return config


def test_nemo_rl_grpo_math_1b_passes(math_1b):
    assert upstream.check_master_config(math_1b, "grpo") == []


def test_nemo_rl_stage3_rlhf_fails_only_for_the_gym_server_the_pinned_gym_lacks(stage3, stage3_in_pinned_gym):
    problems = upstream.check_master_config(stage3, "nemo_gym")
    assert len(problems) == 1, problems
    assert problems[0].startswith("env.nemo_gym: NeMo-Gym rejects it (ConfigPathNotFoundError)")
    assert ABSENT_SERVER in problems[0]
    # with that one config path left out, genrm_compare, genrm_model and vllm_model pass Gym's own validation
    assert upstream.check_master_config(stage3_in_pinned_gym, "nemo_gym") == []


def test_a_missing_schema_key_fails(math_1b):
    problems = upstream.check_master_config(drop(math_1b, "grpo.seq_logprob_error_threshold"), "grpo")
    assert problems == ["grpo.seq_logprob_error_threshold: Field required (MasterConfig)"]


def test_a_gym_instance_with_two_model_servers_fails(stage3_in_pinned_gym):
    config = copy.deepcopy(stage3_in_pinned_gym)
    config["env"]["nemo_gym"]["genrm_model"]["responses_api_models"]["vllm_model"] = {"entrypoint": "app.py"}
    problems = upstream.check_master_config(config, "nemo_gym")
    assert len(problems) == 1, problems
    assert problems[0].startswith("env.nemo_gym.genrm_model: NeMo-Gym rejects this server instance")
    assert "at most 1 item" in problems[0]


def test_a_gym_ref_to_an_undefined_server_fails(stage3_in_pinned_gym):
    config = copy.deepcopy(stage3_in_pinned_gym)
    server = config["env"]["nemo_gym"]["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"]
    server["genrm_model_server"]["name"] = "genrm_modle"
    problems = upstream.check_master_config(config, "nemo_gym")
    assert len(problems) == 1 and "ServerRefNotFoundError" in problems[0] and "'genrm_model'" in problems[0], problems


def gym_row(text: str, prompt_id) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": text}]},
        "agent_ref": {"type": "responses_api_agents", "name": "genrm_simple_agent"},
        "prompt_id": prompt_id,
    }


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_gym_rows(tmp_path):
    # NeMo-Gym's own example rows for genrm_compare, and rows as rlsteps writes them (the same prompt twice included)
    assert upstream.check_rows(NEMO_GYM / "resources_servers/genrm_compare/data/example.jsonl", "nemo_gym") == [
        f"row {n}: prompt_id: missing (genrm_compare then groups rollouts by the input alone)" for n in range(1, 6)
    ]
    good = [gym_row("hi", "p1"), gym_row("hi", "p1"), gym_row("yo", "p2")]
    assert upstream.check_rows(write_rows(tmp_path / "good.jsonl", good), "nemo_gym") == []
    bad = [
        gym_row("hi", "p1"),
        gym_row("hello", "p1"),  # one prompt id, two prompts: genrm_compare never gathers its cohort
        gym_row("yo", 3),  # genrm_compare's verify request takes a string
        {"agent_ref": {"type": "responses_api_agents", "name": "a"}},
        {**gym_row("x", "p4"), "agent_ref": {"name": "a"}},
        "not json",
    ]
    problems = upstream.check_rows(write_rows(tmp_path / "bad.jsonl", bad), "nemo_gym")
    assert sorted(problems) == sorted(
        [
            "row 6: not JSON (Expecting value: line 1 column 1 (char 0))",
            "row 3: prompt_id: Input should be a valid string (genrm_compare's verify request)",
            "row 4: responses_create_params: Field required (NeMo-Gym's BaseRunRequest)",
            "row 5: agent_ref.type: Field required (NeMo-Gym's AgentServerRef)",
            "prompt_id: the rows of prompt_id 'p1' get 2 different genrm_compare cohort keys (their input or "
            "principle differ), so its rollouts are never compared as one cohort",
        ]
    )


def test_response_rows(tmp_path):
    rows = [{"input": "What is 2+2?", "output": ""}, {"prompt": "no input"}, {"input": ["a"], "output": ""}]
    assert upstream.check_rows(write_rows(tmp_path / "rows.jsonl", rows), "grpo") == [
        "row 2: input: missing (ResponseDataset.format_data reads it)",
        "row 3: input: not a string (the prompt's text)",
    ]


def test_shipped_schema_is_nemo_rl_s():
    shipped = Path(nemo_rl_compiler.__file__).parent / "master_config_schema.json"
    schema = upstream.master_config_schema()
    assert json.loads(shipped.read_text()) == schema, "regenerate: python tests/nemo_rl_oracle.py schema > " + str(
        shipped
    )
    assert shipped.read_text() == json.dumps(schema, indent=2, sort_keys=True) + "\n"
    assert schema["grpo.seq_logprob_error_threshold"] == {"type": "float | None", "required": True}
    assert schema["env"] == {"type": "dict[str, Any]", "required": True, "open": True}
    assert schema["policy.generation.vllm_cfg.expert_parallel_size"]["required"] is False
