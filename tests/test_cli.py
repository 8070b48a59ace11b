"""The command line end to end: typer's runner in process, and real subprocesses."""

import json
import sys

import pytest

from cli_helpers import REPO, Result, invoke, run_cli

STEPS = [
    "rl/rs", "rl/reinforce", "rl/rlhf", "rl/nemo_rl/rlhf", "convert/hf_to_megatron", "convert/megatron_to_hf",
    "eval/policy",
]  # fmt: skip


def test_list_table_and_json():
    table = invoke("list")
    assert table.exit_code == 0 and all(s in table.stdout for s in STEPS)
    listed = json.loads(invoke("list", "--json").stdout)
    assert [s["id"] for s in listed] == sorted(STEPS)
    grpo = [s["id"] for s in json.loads(invoke("steps", "list", "--json", "--tag", "grpo").stdout)]
    assert grpo == ["rl/nemo_rl/rlhf", "rl/rlhf"]
    assert {s["id"] for s in json.loads(invoke("list", "--json", "--consumes", "reward_model_hf").stdout)} == {
        "rl/rs",
        "rl/reinforce",
        "rl/rlhf",
        "eval/policy",
    }


def test_list_with_unknown_type_is_a_usage_error():
    result = invoke("list", "--consumes", "checkpoint_hff")
    assert result.exit_code == 2 and "unknown artifact type" in result.stderr


@pytest.mark.parametrize("step", STEPS)
def test_show_each_step(step):
    shown = invoke("show", step)
    assert shown.exit_code == 0 and step in shown.stdout and "strategies" in shown.stdout
    data = json.loads(invoke("steps", "show", step.split("/", 1)[-1], "--json").stdout)  # rs, nemo_rl/rlhf, ...
    assert data["id"] == step and data["consumes"] and data["produces"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("config", ["tiny", "default"])
def test_dry_run_each_step_prints_config_and_command_and_writes_nothing(step, config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inputs = {
        "convert": ["inputs.checkpoint=/ckpt/x"],
        "nemo_rl": ["data.train.data_path=/data/p.jsonl", "policy.model_name=/ckpt/sft"],  # NeMo-RL's keys
    }.get(step.split("/")[-2], ["inputs.prompts=/data/p.jsonl", "inputs.policy=/ckpt/sft"])
    extra = inputs if config == "default" else []
    result = invoke("run", step, "-c", config, "--dry-run", *extra)
    # the inputs given to a default config do not exist here: the dry run shows everything, then exits 3 naming them
    assert result.exit_code == (0 if config == "tiny" else 3), result.output
    assert config == "tiny" or ("the run would refuse" in result.stderr and "does not exist" in result.stderr)
    assert "merged config" in result.stdout and "rlsteps.engine.run.worker" in result.stdout
    assert "nothing was written" in result.stdout
    assert not (tmp_path / ".rlsteps").exists()


def test_dry_run_masks_secrets_and_shows_overrides_and_passthrough():
    result = invoke("run", "rs", "-c", "tiny", "-d", "rm.token=hunter2", "train.lr=0.5", "--", "--log-level", "debug")
    assert result.exit_code == 0
    assert "hunter2" not in result.stdout and "rm.token=******" in result.stdout
    assert "--log-level debug" in result.stdout and "lr: 0.5" in result.stdout


def test_worker_arguments_the_worker_would_reject_are_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", "rs", "-c", "tiny", "--", "--no-such-option")
    assert result.exit_code == 2 and "--no-such-option" in result.output and "--log-level" in result.output
    assert not (tmp_path / ".rlsteps").exists()


def test_steps_run_is_the_same_command():
    assert invoke("steps", "run", "rl/rs", "-c", "tiny", "--dry-run").exit_code == 0


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["run", "rl/rx", "-d"], 2, "did you mean rl/rs"),
        (["run", "rs", "-c", "tiny", "-d", "train.lrr=1"], 2, "train.lr"),
        (["run", "rs", "-c", "tiny", "-r", "a", "-b", "b"], 2, "-r and -b are exclusive"),
        (["run", "rs", "-c", "tiny", "-d", "oops"], 2, "unexpected argument 'oops'"),
        (["run", "rs", "-c", "nope", "-d"], 2, "config 'nope' not found"),
        (["run", "rs", "-c", "tiny", "-r", "nowhere", "-d"], 2, "unknown profile 'nowhere'"),
        (["run", "rs", "-c", "tiny", "-d", "rollout.top_n_rollouts=99"], 2, "exceeds rollout.num_rollouts_per_prompt"),
        (["run", "rs"], 2, "required config keys without a value: inputs.policy, inputs.prompts"),
    ],
)
def test_usage_errors_exit_2_with_the_cause(argv, code, message):
    result = invoke(*argv)
    assert result.exit_code == code and message in result.output


def test_a_dry_run_shows_everything_the_run_still_needs_at_once_and_exits_0():
    result = invoke("run", "rl/rlhf", "-c", "default", "--dry-run")
    assert result.exit_code == 0, result.output
    needed = result.output[result.output.index("the run will need") : result.output.index("input artifacts")]
    for line in ("inputs.prompts=PATH", "inputs.policy=PATH", "inputs.judge_model=PATH", "(or judge.url=VALUE)"):
        assert line in needed
    given = invoke("run", "rl/rlhf", "-c", "default", "--dry-run", "judge.url=http://judge:8000/v1")
    assert given.exit_code == 0 and "judge_model=PATH" not in given.output


def test_subprocess_errors_print_cause_and_fix_on_one_line_each(tmp_path):
    result = run_cli("run", "rs", "-c", "tiny", "-d", "train.lrr=1", cwd=tmp_path)
    assert result.exit_code == 2
    assert "error: unknown config key 'train.lrr'" in result.stderr and "fix: did you mean 'train.lr'" in result.stderr
    assert "Traceback" not in result.stderr


def run_default_rs(tmp_path, policy) -> Result:
    """`rlsteps run rs -c default` with a one-line prompt file and the given policy reference."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    policy = prompts if policy == "the prompts" else policy
    args = ("-c", "default", f"inputs.prompts={prompts}", f"inputs.policy={policy}", "rm.url=http://127.0.0.1:9")
    return run_cli("run", "rs", *args, cwd=tmp_path)


def test_missing_input_artifact_exits_3_before_any_job_dir(tmp_path):
    result = run_default_rs(tmp_path, tmp_path / "none")
    assert result.exit_code == 3, result.output
    assert "does not exist" in result.stderr and "inputs.policy" in result.stderr
    assert not (tmp_path / ".rlsteps").exists()


def test_mistyped_input_artifact_exits_3_and_names_both_types(tmp_path):
    result = run_default_rs(tmp_path, "the prompts")
    assert result.exit_code == 3
    assert "is prompt_jsonl, but a checkpoint (checkpoint_hf or checkpoint_megatron) is required" in result.stderr


def test_reward_model_required_unless_a_url_is_given(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (policy / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")  # whole, and no tensor
    (policy / "tokenizer.json").write_text("{}")  # a policy without one is refused first
    result = run_cli("run", "rs", "-c", "default", f"inputs.prompts={prompts}", f"inputs.policy={policy}", cwd=tmp_path)
    assert result.exit_code == 3 and "input 'reward_model' (reward_model_hf) is required" in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["list"],
        ["show", "rs"],
        ["run", "rs", "-c", "tiny", "--dry-run"],
        ["run", "rl/nemo_rl/rlhf", "-c", "tiny", "--dry-run"],
        ["pipeline", "run", "examples/pipelines/tiny.yaml", "--dry-run"],
    ],
)
def test_fast_paths_import_neither_torch_nor_transformers(argv):
    """Nor anything of the engine but the `serve` commands the command line registers: the rest of what a submission
    needs of the worker is rlsteps.contract."""
    code = (
        "import sys, io, contextlib\n"
        "from rlsteps.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    code = main({argv!r})\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "serve = ('rlsteps.engine.rewards.judge.command', 'rlsteps.engine.rewards.rm.command',\n"
        "         'rlsteps.engine.rewards.serve_command', 'rlsteps.engine.rewards.auth')\n"
        "engine = [m for m in sys.modules if m.startswith('rlsteps.engine.') and m not in serve\n"
        "          and not hasattr(sys.modules[m], '__path__')]\n"
        "assert not engine, engine\n"
        "print(code)\n"
    )
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("0", "None")


def test_console_script_runs():
    result = run_cli("--help")
    assert result.exit_code == 0 and "run" in result.stdout and "list" in result.stdout


def test_unknown_command_and_bad_option_are_usage_errors_without_traceback():
    for argv in (["nosuchcommand"], ["list", "--nope"]):
        result = run_cli(*argv)
        assert result.exit_code == 2 and "Traceback" not in result.stderr


def test_on_a_fresh_machine_tiny_inputs_are_pending_not_missing(tmp_path):
    """The tiny world is built when a real run starts: dry runs of a step and of a pipeline must not fail on it."""
    env = {"RLSTEPS_HOME": str(tmp_path / "empty-home")}
    step = run_cli("run", "rs", "-c", "tiny", "--dry-run", cwd=tmp_path, env=env)
    assert step.exit_code == 0 and "written before the run" in step.stdout and "missing" not in step.stdout
    pipeline = run_cli(
        "pipeline",
        "run",
        str(REPO / "examples" / "pipelines" / "tiny.yaml"),
        "--dry-run",
        cwd=tmp_path,
        env={**env, "RLSTEPS_ARTIFACTS": str(tmp_path / "store")},
    )
    assert pipeline.exit_code == 0, pipeline.output
    assert not (tmp_path / "empty-home").exists()  # a dry run builds nothing


def test_ctrl_c_before_the_launcher_takes_over_exits_130_and_says_so(monkeypatch, capsys):
    from rlsteps.cli.app import main
    from rlsteps.plan import runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "execute", interrupted)
    assert main(["run", "rs", "-c", "tiny"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_an_attached_run_interrupted_with_ctrl_c_exits_130_not_1(monkeypatch, capsys, tmp_path, tiny_world):
    from rlsteps.cli.app import main
    from rlsteps.launch import local

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(local, "_run_attached", lambda command, env, **_: 130)  # what the worker returns after Ctrl-C
    assert main(["run", "rs", "-c", "tiny"]) == 130
    err = capsys.readouterr().err
    assert "rl/rs was interrupted" in err and "rerun the same command" in err


def test_list_and_show_fit_80_columns_and_never_break_an_id():
    from typer.testing import CliRunner

    from rlsteps.cli.app import app

    def at_80(*argv: str) -> list[str]:
        result = CliRunner().invoke(app, list(argv), env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert max(len(line) for line in lines) <= 80, result.output
        return lines

    listed = at_80("list")
    assert all(any(line.startswith(step) for line in listed) for step in STEPS)  # each id whole, on its own line
    for step in STEPS:
        shown = at_80("show", step)
        assert len(shown) < 70, "\n".join(shown)  # not one word a line
        assert any(line.strip().startswith("policy ") for line in shown)  # an artifact line, name first
