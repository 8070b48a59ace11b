"""The NeMo-RL job's own stages on real files: prepare (the tiny Megatron policy converted to HF with rlsteps's
converter, the prompts as NeMo-RL's rows) and finish (NeMo-RL's last checkpoint, written by NeMo-RL's own
CheckpointManager, back as a typed artifact)."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlsteps
import upstream
from rlsteps.artifacts.detect import detect_types
from rlsteps.catalog import load_catalog
from rlsteps.contract.config import STEP_SCHEMAS
from rlsteps.contract.input_check import InputProblem
from rlsteps.contract.nemo_rl_job import optimizer_steps_per_step
from rlsteps.contract.prompts import PromptFileError
from rlsteps.engine.nemo_rl_stages import stages
from rlsteps.engine.nemo_rl_stages.data import write_rows
from rlsteps.engine.policy.model import load_policy
from rlsteps.plan.compile import compile_job

PROMPTS = [
    {"prompt": "Describe the cat.", "id": "cat"},
    {"messages": [{"role": "user", "content": "Name a dog."}], "id": 7},
    {"prompt": "Count to three."},
]


def config_of(step: str, run: Path, *overrides: str):
    job = compile_job(load_catalog().find(step), "tiny", overrides=["engine=nemo_rl", f"output.dir={run}", *overrides])
    return STEP_SCHEMAS[job.algorithm].model_validate(job.config)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rlhf_rows_are_nemo_gym_rows_with_the_conversation_agent_and_prompt_id(tmp_path):
    target = tmp_path / "rows.jsonl"
    assert write_rows(str(write_jsonl(tmp_path / "p.jsonl", PROMPTS)), target, "grpo", "genrm_simple_agent") == 3
    first, second, third = read_jsonl(target)
    assert first == {
        "responses_create_params": {"input": [{"role": "user", "content": "Describe the cat."}]},
        "agent_ref": {"type": "responses_api_agents", "name": "genrm_simple_agent"},
        "prompt_id": "cat",
    }
    assert second["responses_create_params"]["input"] == [{"role": "user", "content": "Name a dog."}]
    assert second["prompt_id"] == "7" and third["prompt_id"] == "p:3"  # no id: file stem and line, as rlsteps names it


def test_reinforce_rows_are_response_rows_and_a_multi_turn_prompt_is_refused(tmp_path):
    target = tmp_path / "rows.jsonl"
    write_rows(str(write_jsonl(tmp_path / "p.jsonl", PROMPTS)), target, "reinforce", "unused")
    assert read_jsonl(target) == [
        {"input": "Describe the cat.", "output": ""},
        {"input": "Name a dog.", "output": ""},
        {"input": "Count to three.", "output": ""},
    ]
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "?"},
    ]
    multi = write_jsonl(tmp_path / "multi.jsonl", [{"prompt": "ok"}, {"messages": turns}])
    with pytest.raises(PromptFileError, match=r"multi.jsonl: prompt 2: .* has 3 messages: .*single-turn"):
        write_rows(str(multi), tmp_path / "never.jsonl", "reinforce", "unused")
    assert not (tmp_path / "never.jsonl").exists()


def test_a_malformed_line_is_refused_with_its_file_and_line(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine"}, '{"prompt": "cut off'])
    with pytest.raises(PromptFileError, match=r"bad.jsonl:2: invalid JSON"):
        write_rows(str(bad), tmp_path / "rows.jsonl", "grpo", "agent")


def test_prepare_converts_the_megatron_policy_to_hf_with_the_same_logits_once(tiny_world, tmp_path):
    cfg = config_of("reinforce", tmp_path / "run")
    stages.prepare(cfg, job={})
    paths = stages.paths_of(cfg)
    hf_dir = Path(paths.policy)
    assert (hf_dir / "config.json").is_file() and not hf_dir.with_name("policy_hf.partial").exists()
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    megatron_model, _ = load_policy(tiny_world.policy_megatron)
    tokens = torch.randint(0, hf_model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(hf_model(tokens).logits, megatron_model.eval()(tokens).logits)
    assert len(read_jsonl(Path(paths.train_data))) == len(tiny_world.train_prompts.read_text().splitlines())
    assert Path(paths.val_data).is_file()
    before = (hf_dir / "model.safetensors").stat().st_mtime_ns
    stages.prepare(cfg, job={})  # a requeued job: the conversion is done, not redone
    assert (hf_dir / "model.safetensors").stat().st_mtime_ns == before


def test_prepare_links_an_hf_policy_and_refuses_a_missing_one(tiny_world, tmp_path):
    cfg = config_of("rlhf", tmp_path / "run", f"inputs.policy={tiny_world.policy}")
    stages.prepare(cfg, job={})
    linked = Path(stages.paths_of(cfg).policy)
    assert linked.is_symlink() and linked.resolve() == tiny_world.policy.resolve()
    row = read_jsonl(Path(stages.paths_of(cfg).train_data))[0]
    assert row["agent_ref"]["name"] == "genrm_simple_agent"
    gone = config_of("rlhf", tmp_path / "other", f"inputs.policy={tmp_path / 'nowhere'}")
    with pytest.raises(InputProblem, match="does not exist"):
        stages.prepare(gone, job={})


CHECKPOINTS = Path(__file__).with_name("nemo_rl_checkpoints.py")
STANDIN = Path(__file__).with_name("nemo_rl_standin.py")
STANDIN_EXPORT = f"{shlex.quote(sys.executable)} {STANDIN} export {{weights}} {{hf_dir}}"  # for NeMo-RL's converter
SCALE_PER_STEP = 0.01


def nemo_rl_checkpoints(cfg, policy: Path, *, epochs: int, steps: int, per_epoch: int, **checkpointing) -> Path:
    """NeMo-RL's GRPO checkpoints written by NeMo-RL's own CheckpointManager (tests/nemo_rl_checkpoints.py, the
    pinned source, real torch, a process of its own) in the DTensor v2 worker's layout; the checkpoints folder."""
    upstream.unpacked("nemo_rl")  # skips (or fails under RLSTEPS_REQUIRE_UPSTREAM=1) without the archive
    folder = Path(stages.paths_of(cfg).checkpoints)
    master = {
        "grpo": {"max_num_epochs": epochs, "max_num_steps": steps, "num_prompts_per_step": 4},
        "checkpointing": {
            "enabled": True,
            "checkpoint_dir": str(folder),
            "metric_name": None,
            "higher_is_better": True,
            "keep_top_k": 2,
            "save_period": 2,
            "save_optimizer": True,
            "model_save_format": "safetensors",
            "save_consolidated": False,
            **checkpointing,
        },
        "policy": {"model_name": str(policy)},
    }
    spec = {"master": master, "policy": str(policy), "steps_per_epoch": per_epoch, "scale_per_step": SCALE_PER_STEP}
    spec_file = folder.parent / "checkpoints_run.json"
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(json.dumps(spec | {"cut_short": True}))
    done = subprocess.run([sys.executable, str(CHECKPOINTS), str(spec_file)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return folder


def trained(policy: Path, step: int) -> dict:
    """The weights the checkpoint of total step `step` holds: the policy's, scaled as the writer does."""
    from safetensors.torch import load_file

    return {name: t * (1.0 + SCALE_PER_STEP * step) for name, t in load_file(policy / "model.safetensors").items()}


@pytest.mark.slow  # writes and reads Megatron checkpoints
def test_finish_writes_the_checkpoint_of_the_last_total_step_with_nemo_rls_counters(tiny_world, tmp_path):
    """Three epochs of 3 GRPO steps, cut at max_num_steps 7 (step 1 of epoch 3), a checkpoint every 2 steps and at
    the end, the 2 latest kept, and a tmp_step_8 begun but never finished: step_7, with total_steps (not the
    epoch's current_step 1)."""
    cfg = config_of(
        "reinforce", tmp_path / "run", f"nemo_rl_job.export={STANDIN_EXPORT}", f"nemo_rl_job.workdir={tmp_path}"
    )
    stages.prepare(cfg, job={})
    folder = nemo_rl_checkpoints(cfg, tiny_world.policy, epochs=3, steps=7, per_epoch=3)
    assert sorted(p.name for p in folder.iterdir()) == ["step_6", "step_7", "tmp_step_8"]  # keep_top_k pruned 2, 4
    info = json.loads((folder / "step_7" / "training_info.json").read_text())
    assert (info["current_step"], info["current_epoch"], info["total_steps"]) == (1, 2, 7)
    assert stages.last_checkpoint(folder) == folder / "step_7"
    target = stages.finish(cfg, job={"job": {"step": "rl/reinforce", "name": "j1"}})
    assert target == Path(cfg.output.dir) / "policy"
    assert "checkpoint_megatron" in detect_types(load_catalog(), str(target))
    written = json.loads((target / "rlsteps_artifact.json").read_text())
    per_step = optimizer_steps_per_step(cfg.model_dump(mode="json"))
    assert written["counters"] == {"step": 7, "consumed_samples": 28, "epoch": 2, "optimizer_steps": 7 * per_step}
    assert written["producer"] | {"rlsteps": None} == {
        "step": "rl/reinforce",
        "job": "j1",
        "algorithm": "reinforce",
        "engine": "nemo_rl",
        "rlsteps": None,
    }
    assert written["producer"]["rlsteps"]["version"] == rlsteps.__version__
    exported = Path(stages.paths_of(cfg).exported)
    from safetensors.torch import load_file

    got, expected = load_file(exported / "model.safetensors"), trained(tiny_world.policy, 7)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    assert (exported / "tokenizer_config.json").is_file()  # from the checkpoint's policy/tokenizer
    model, tokenizer = load_policy(target)
    assert tokenizer("a cat").input_ids
    start, _ = load_policy(tiny_world.policy)
    assert not all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), start.state_dict().values()))


@pytest.mark.slow  # writes and reads Megatron checkpoints
def test_a_checkpoint_without_its_training_info_is_not_nemo_rls_and_is_passed_over(tiny_world, tmp_path):
    cfg = config_of("reinforce", tmp_path / "run")
    folder = nemo_rl_checkpoints(cfg, tiny_world.policy, epochs=1, steps=4, per_epoch=4, keep_top_k=None)
    assert sorted(p.name for p in folder.iterdir()) == ["step_2", "step_4", "tmp_step_5"]
    (folder / "step_9" / "policy").mkdir(parents=True)  # not written by NeMo-RL's CheckpointManager
    assert stages.last_checkpoint(folder) == folder / "step_4"
    assert stages.counters_of(folder / "step_4", cfg.model_dump(mode="json"))["step"] == 4


@pytest.mark.slow  # writes and reads Megatron checkpoints
def test_finish_says_when_there_is_nothing_to_export_or_the_export_fails(tiny_world, tmp_path):
    failing = f"{sys.executable} -c 'import sys; sys.exit(5)'"
    cfg = config_of("reinforce", tmp_path / "run", f"nemo_rl_job.export={failing}", f"nemo_rl_job.workdir={tmp_path}")
    with pytest.raises(stages.NemoRlOutputError, match="no finished checkpoint"):
        stages.finish(cfg, job={})
    nemo_rl_checkpoints(cfg, tiny_world.policy, epochs=2, steps=4, per_epoch=2)
    with pytest.raises(stages.NemoRlOutputError, match="step_4 failed with exit code 5"):
        stages.finish(cfg, job={})
    assert not (Path(cfg.output.dir) / "policy").exists()


def test_the_default_export_is_nemo_rls_converter_for_the_backend(tmp_path):
    checkpoint = tmp_path / "step_9"
    dtensor = config_of("rlhf", tmp_path / "run")
    assert stages.export_command(dtensor, checkpoint, tmp_path / "hf") == [
        "uv", "run", "python", "examples/converters/convert_dcp_to_hf.py",
        "--config", str(checkpoint / "config.yaml"),
        "--dcp-ckpt-path", str(checkpoint / "policy" / "weights"),
        "--hf-ckpt-path", str(tmp_path / "hf"),
    ]  # fmt: skip
    megatron = config_of("rlhf", tmp_path / "run", "nemo_rl_job.policy_backend=megatron")
    words = stages.export_command(megatron, checkpoint, tmp_path / "hf")
    assert "examples/converters/convert_megatron_to_hf.py" in words
    assert str(checkpoint / "policy" / "weights" / "iter_0000000") in words


@pytest.mark.slow  # the stage command in processes of its own
def test_the_stage_command_exits_3_for_a_missing_input_and_0_when_prepared(tiny_world, tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    cfg = config_of("reinforce", tmp_path / "run")
    (job_dir / "config.yaml").write_text(json.dumps(cfg.model_dump(mode="json")))
    command = [sys.executable, "-m", "rlsteps.engine.nemo_rl_stages", "prepare", str(job_dir / "config.yaml")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "converted to HF" in done.stderr
    missing = cfg.model_copy(update={"inputs": cfg.inputs.model_copy(update={"policy": str(tmp_path / "gone")})})
    moved = missing.model_dump(mode="json") | {"output": {"dir": str(tmp_path / "r2")}}
    (job_dir / "config.yaml").write_text(json.dumps(moved))
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr


def test_the_stages_ask_only_for_what_checkpoints_need(monkeypatch):
    """NeMo-RL's container need not hold the engine's servers or plots: their absence stops the worker, not these."""
    import importlib.util

    from rlsteps.engine.run import preflight

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "matplotlib" else real(name))
    assert preflight.shortfalls() == ["matplotlib (not installed)"]
    assert preflight.problem(preflight.CHECKPOINT_NEEDS) is None


@pytest.mark.parametrize(
    ("algorithm", "driver"), [("nemo_rl_grpo", "nemo_gym"), ("grpo", "nemo_gym"), ("reinforce", "grpo")]
)
@pytest.mark.slow  # NeMo-Gym's and NeMo-RL's own code, in processes of their own
def test_the_rows_rlsteps_writes_parse_with_nemo_gyms_and_nemo_rls_own_code(tmp_path, algorithm, driver):
    """NeMo-Gym's run request and agent ref models (and genrm_compare's cohort key from prompt_id), or NeMo-RL's
    ResponseDataset, read every row; single-turn prompts for reinforce, whose processor reads one message."""
    prompts = PROMPTS if driver == "nemo_gym" else [PROMPTS[0], PROMPTS[2]]
    target = tmp_path / "rows.jsonl"
    write_rows(str(write_jsonl(tmp_path / "p.jsonl", prompts)), target, algorithm, "genrm_simple_agent")
    assert upstream.check_rows(target, driver) == []


def test_nemo_gym_rows_are_prompts_too_and_pass_through_whole(tmp_path):
    """The seed's strategy: data paths at prepared NeMo-Gym JSONL files. Each row is a prompt (its input, its
    prompt_id) for the embedded engine, and reaches NeMo-RL as it was, with its own fields."""
    gym = [
        {"responses_create_params": {"input": [{"role": "user", "content": "Name a cat."}]}, "prompt_id": 3,
         "principle": "Be brief."},
        {"responses_create_params": {"input": "Name a dog."}, "prompt_id": "dog",
         "agent_ref": {"type": "responses_api_agents", "name": "my_agent"}},
    ]  # fmt: skip
    source = write_jsonl(tmp_path / "gym.jsonl", gym)
    from rlsteps.contract.prompts import load_prompts

    first, second = load_prompts(str(source), tokenizer=None)
    assert (first.id, first.conversation) == ("3", [{"role": "user", "content": "Name a cat."}])
    assert (second.id, second.conversation) == ("dog", [{"role": "user", "content": "Name a dog."}])
    target = tmp_path / "rows.jsonl"
    write_rows(str(source), target, "nemo_rl_grpo", "genrm_simple_agent")
    one, two = read_jsonl(target)
    assert one["principle"] == "Be brief." and one["agent_ref"]["name"] == "genrm_simple_agent"
    assert one["prompt_id"] == "3" and two["agent_ref"]["name"] == "my_agent"
    assert upstream.check_rows(target, "nemo_gym") == []
