"""Tiny runs on two processes (torchrun, gloo, FSDP2), as a user starts them: a local profile with
nprocs_per_node: 2. They learn, end with the weights one process ends with, and resume on another count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from policy_speech import against_sft, validation_prompts
from run_helpers import FAST, kill_group, rlsteps, run_dir, series, start_rlsteps, wait_for, weights

pytestmark = pytest.mark.slow

TWO_PROCESSES = "profiles:\n  two:\n    executor: local\n    nprocs_per_node: 2\n"
SAME_BATCHES = ["train.micro_batch_size=8"]  # 16 rows per optimizer step: 8 per process, one micro-batch each


def project(root: Path) -> Path:
    root.mkdir()
    (root / "rlsteps.yaml").write_text(TWO_PROCESSES)
    return root


def assert_close_weights(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


def test_a_tiny_run_on_two_processes_raises_the_reward_and_ends_where_one_process_ends(
    tiny_world, tmp_path, monkeypatch
):
    one, two = project(tmp_path / "one"), project(tmp_path / "two")
    monkeypatch.setenv("RLSTEPS_PEAK_TFLOPS", "1")  # a CPU has no known peak: give one, so MFU is logged
    assert rlsteps("run", "rl/rs", "-c", "tiny", *SAME_BATCHES, *FAST, cwd=one).returncode == 0
    done = rlsteps("run", "rl/rs", "-c", "tiny", "-r", "two", *SAME_BATCHES, *FAST, cwd=two)
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(two, "rl_rs")
    true = series(run, "val/true_reward")
    assert len(true) == 5 and true[-1] >= 2.0, true  # as high as one process ends (test_runs)
    # and says it as well as the SFT policy did (tests/policy_speech.py)
    figures, worse = against_sft(run / "policy", tiny_world.policy_megatron, validation_prompts(tiny_world.val_prompts))
    assert not worse, f"{worse}\n{figures}"
    assert "process 1 of 2" in (run / "train.rank1.log").read_text()
    # Two processes sum the gradient in another order than one: float32 rounding differs in the last bits, and after
    # enough steps a sampled token may flip in one rollout (one row of 64: a step's mean moves by < 0.05). Until then
    # the runs agree to 1e-4; a wrong split of the data or the batch would part them at once and by far more.
    two_rewards, one_rewards = series(run, "train/reward"), series(run_dir(one, "rl_rs"), "train/reward")
    assert two_rewards[:8] == pytest.approx(one_rewards[:8], abs=1e-4)
    assert two_rewards == pytest.approx(one_rewards, abs=0.05)
    assert_close_weights(weights(run_dir(one, "rl_rs") / "policy"), weights(run / "policy"), atol=1e-4)
    assert all(v > 0 for v in series(run, "perf/train_tokens_per_s") + series(run, "perf/generation_tokens_per_s"))
    assert all(0 < v < 1 for v in series(run, "perf/train_mfu")) and len(series(run, "perf/peak_rss_gb")) == 16


def test_a_two_process_run_killed_mid_run_resumes_on_one_process_to_the_same_weights(tiny_world, tmp_path):
    short = [*SAME_BATCHES, "train.max_steps=4", "checkpoint.interval=2", "validation.interval=0", *FAST]
    straight, interrupted = project(tmp_path / "straight"), project(tmp_path / "interrupted")
    assert rlsteps("run", "rl/rs", "-c", "tiny", *short, cwd=straight).returncode == 0

    process = start_rlsteps("run", "rl/rs", "-c", "tiny", "-r", "two", *short, cwd=interrupted, log=tmp_path / "a.log")
    wait_for(run_dir(interrupted, "rl_rs") / "checkpoints" / "step_2" / "COMPLETE", 300, process)
    kill_group(process)
    resumed = rlsteps("run", "rl/rs", "-c", "tiny", *short, cwd=interrupted)  # one process now
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "written by 2 process(es), read by 1" in resumed.stderr
    assert_close_weights(
        weights(run_dir(straight, "rl_rs") / "policy"), weights(run_dir(interrupted, "rl_rs") / "policy"), atol=1e-5
    )


def test_a_lora_run_on_two_processes_resumes_on_one_and_ends_where_two_processes_end(tiny_world, tmp_path):
    """FSDP2 over a policy with LoRA adapters: sampled from gathered, its reference the base with the adapters off,
    its checkpoint the adapters' shards (read back by one process), its output gathered, merged and saved."""
    lora = ["train.lora.enabled=true", "train.lr=3e-3", "rollout.prompts_per_step=8"]
    short = [*SAME_BATCHES, *lora, "train.max_steps=4", "checkpoint.interval=2", "validation.interval=0", *FAST]
    straight, interrupted = project(tmp_path / "straight"), project(tmp_path / "interrupted")
    done = rlsteps("run", "rl/reinforce", "-c", "tiny", "-r", "two", *short, cwd=straight)
    assert done.returncode == 0, done.stderr[-3000:]

    process = start_rlsteps(
        "run", "rl/reinforce", "-c", "tiny", "-r", "two", *short, cwd=interrupted, log=tmp_path / "a.log"
    )
    wait_for(run_dir(interrupted, "rl_reinforce") / "checkpoints" / "step_2" / "COMPLETE", 300, process)
    kill_group(process)
    resumed = rlsteps("run", "rl/reinforce", "-c", "tiny", *short, cwd=interrupted)  # one process now
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "written by 2 process(es), read by 1" in resumed.stderr
    a, b = run_dir(straight, "rl_reinforce"), run_dir(interrupted, "rl_reinforce")
    merged = weights(a / "policy")
    assert merged.keys() == weights(tiny_world.policy_megatron).keys()  # the base model's names: adapters merged
    assert_close_weights(merged, weights(b / "policy"), atol=1e-4)
    adapters = [load_file(str(run / "adapter" / "adapter_model.safetensors")) for run in (a, b)]
    assert_close_weights(*adapters, atol=1e-4)
    assert all(1.0 <= x < 1.001 for x in series(a, "train/token_mult_prob_error"))
