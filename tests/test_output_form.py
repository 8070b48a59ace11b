"""A run that could not write the output form its config asks for is refused before anything starts, by the dry run
too, in one line with the fix: a policy with no Megatron GPT layout, or no megatron-core where the run writes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from cli_helpers import invoke, run_cli


@pytest.fixture(scope="module")
def gpt2_policy(tiny_world, tmp_path_factory) -> Path:
    """A tiny random GPT-2 (LayerNorm, a GELU MLP, learned positions: no Megatron GPT layout here) with the tiny
    world's tokenizer, so the tiny config's prompts fit it."""
    out = tmp_path_factory.mktemp("gpt2")
    tokenizer = AutoTokenizer.from_pretrained(tiny_world.policy)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=256)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_the_dry_run_refuses_a_megatron_output_of_an_architecture_without_a_megatron_layout(gpt2_policy, tmp_path):
    result = run_cli("run", "rl/reinforce", "-c", "tiny", f"inputs.policy={gpt2_policy}", "--dry-run", cwd=tmp_path)
    assert result.exit_code == 2, result.output
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "GPT2LMHeadModel is not supported for Megatron checkpoints" in error[0], result.stderr
    assert "fix: pass output.type=checkpoint_hf" in result.stderr
    assert "merged config" in result.stdout or "rl/reinforce" in result.stdout  # the job is shown before the refusal


def test_the_run_is_refused_before_anything_is_written_and_the_hf_form_is_accepted(gpt2_policy, tmp_path):
    refused = run_cli("run", "rl/reinforce", "-c", "tiny", f"inputs.policy={gpt2_policy}", cwd=tmp_path)
    assert refused.exit_code == 2, refused.output
    assert "output.type=checkpoint_hf" in refused.stderr
    assert not (tmp_path / ".rlsteps").exists(), "a refused run wrote its job or run directory"
    accepted = run_cli(
        "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={gpt2_policy}", "output.type=checkpoint_hf", "--dry-run",
        cwd=tmp_path,
    )  # fmt: skip
    assert accepted.exit_code == 0, accepted.output


def test_the_convert_step_is_refused_the_same_way(gpt2_policy, tmp_path):
    result = run_cli("run", "convert/hf_to_megatron", f"inputs.checkpoint={gpt2_policy}", "--dry-run", cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert "input 'checkpoint'" in result.stderr and "GPT2LMHeadModel" in result.stderr


def test_a_megatron_output_without_megatron_core_is_refused_with_the_extra_to_install(
    tiny_world, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    for name in [n for n in sys.modules if n == "megatron" or n.startswith("megatron.")] + ["megatron"]:
        monkeypatch.setitem(sys.modules, name, None)  # as an environment without megatron-core imports it
    result = invoke("run", "rl/rs", "-c", "tiny", "--dry-run")
    assert result.exit_code == 2, result.output
    assert "megatron-core is not installed" in result.stderr
    assert "pip install 'rlsteps[megatron]'" in result.stderr and "output.type=checkpoint_hf" in result.stderr
    assert invoke("run", "rl/rs", "-c", "tiny", "output.type=checkpoint_hf", "--dry-run").exit_code == 0


def test_the_worker_refuses_it_too_before_training(gpt2_policy, tiny_world, tmp_path):
    """A job another launcher started (or whose policy changed after rlsteps looked) meets the same refusal at the
    worker's start, before a step: no checkpoint, exit 1, one line with the fix."""
    import yaml

    from rlsteps.catalog import load_catalog
    from rlsteps.plan.compile import compile_job

    run = tmp_path / "run"
    overrides = [f"inputs.policy={gpt2_policy}", "run.num_threads=1", f"output.dir={run}"]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(compile_job(load_catalog().find("rl/rs"), "tiny", overrides=overrides).config))
    worker = subprocess.run([sys.executable, "-m", "rlsteps.engine.run.worker", str(config)], capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert worker.returncode == 1 and "Traceback" not in worker.stderr, worker.stderr[-2000:]
    assert "GPT2LMHeadModel is not supported for Megatron checkpoints" in worker.stderr
    assert "output.type=checkpoint_hf" in worker.stderr
    assert not (run / "checkpoints").exists()  # it stopped before the first step
