"""Each server has two command lines, `rlsteps serve X` and `python -m rlsteps.engine.rewards.X`: one definition."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from cli_helpers import REPO, run_cli

SERVERS = {  # rlsteps serve NAME  ->  python -m MODULE
    "rm": "rlsteps.engine.rewards.rm",
    "judge": "rlsteps.engine.rewards.judge",
}


def _options(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", help_text)) - {"--help"}


def _python_m(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_both_command_lines_of_a_server_take_the_same_options(name):
    from_rlsteps = run_cli("serve", name, "--help")
    from_module = _python_m(SERVERS[name], "--help")
    assert from_rlsteps.exit_code == 0 and from_module.returncode == 0, from_module.stderr
    batch_job = {"--batch", "--dry-run", "--force-squash"}  # rlsteps serve's own: the server as a Slurm job
    assert _options(from_rlsteps.stdout) - batch_job == _options(from_module.stdout)
    assert {"--model", "--host", "--port", "--device", "--token-env"} <= _options(from_module.stdout)


def test_the_reward_model_server_takes_its_length_and_batch_options_from_both():
    for help_text in (run_cli("serve", "rm", "--help").stdout, _python_m(SERVERS["rm"], "--help").stdout):
        assert {"--max-length", "--batch-size", "--max-batch", "--max-wait-ms", "--max-queue"} <= _options(help_text)


def test_the_judge_server_takes_its_batching_options_from_both():
    for help_text in (run_cli("serve", "judge", "--help").stdout, _python_m(SERVERS["judge"], "--help").stdout):
        batching = {"--max-batch", "--max-wait-ms", "--max-queue", "--batch-size", "--max-length", "--dtype"}
        assert batching <= _options(help_text)


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_an_unset_token_variable_is_a_usage_error_in_both(name, monkeypatch, tmp_path):
    monkeypatch.delenv("RLSTEPS_TEST_UNSET_TOKEN", raising=False)
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForSequenceClassification"]}')
    args = ("--model", str(tmp_path), "--token-env", "RLSTEPS_TEST_UNSET_TOKEN")
    from_rlsteps = run_cli("serve", name, *args)
    from_module = _python_m(SERVERS[name], *args)
    for code, text in ((from_rlsteps.exit_code, from_rlsteps.output), (from_module.returncode, from_module.stderr)):
        assert code == 2
        assert "RLSTEPS_TEST_UNSET_TOKEN" in text and "Traceback" not in text


def test_the_server_commands_import_no_server_and_no_torch():
    """`rlsteps --help` registers both commands: they must load their servers only when they run."""
    code = (
        "import sys; import rlsteps.engine.rewards.rm.command, rlsteps.engine.rewards.judge.command; "
        "print(sorted(m for m in ('torch', 'transformers', 'fastapi', 'uvicorn', 'starlette') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_a_wrong_model_folder_is_one_line_with_the_fix_before_anything_loads(name, tmp_path):
    causal_lm = tmp_path / "lm"
    causal_lm.mkdir()
    (causal_lm / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    cases = {
        str(tmp_path / "nowhere"): "is not a folder",
        str(tmp_path): "has no readable config.json",
        str(causal_lm): "holds LlamaForCausalLM, not a reward model",
    }
    for model, reason in cases.items():
        done = run_cli("serve", name, "--model", model)
        assert done.exit_code == 2 and reason in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 8
