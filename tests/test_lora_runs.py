"""Tiny steps with LoRA adapters (train.lora) end to end, as a user runs them: the policy learns through its adapters
alone, the output is the merged policy the next step reads, and a killed run resumes bit for bit."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from run_helpers import FAST, artifact_metadata, rlsteps, run_dir, series, straight_and_resumed, weights

pytestmark = pytest.mark.slow

# the adapters alone, at the tiny configs' own rate for them (train.lora.lr 2e-3 to 4e-3, where the whole policy takes
# train.lr 8e-4 to 1.5e-3); the same 16 steps otherwise
LORA = ["train.lora.enabled=true"]


def adapters(run) -> dict:
    return load_file(str(run / "adapter" / "adapter_model.safetensors"))


def test_a_tiny_run_with_lora_learns_through_its_adapters_and_writes_the_merged_policy(tiny_world, tmp_path):
    done = rlsteps("run", "rl/reinforce", "-c", "tiny", *LORA, *FAST, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(tmp_path, "rl_reinforce")
    # the hidden reward: 1.0 (the SFT policy's greedy answers) to 2.52-3.0 over run seeds 0-2 on the tiny world v21 at
    # the config's own train.lora.lr (4e-3), where full fine-tuning reaches 2.5-3.0 (test_runs); on v17 2.0-2.08
    true = series(run, "val/true_reward")
    assert len(true) == 5 and true[0] == 1.0 and true[-1] >= 2.5, true
    kl = series(run, "train/init_policy_kl")  # the reference is the base: the policy starts on it, then leaves it
    assert kl[0] < 1e-6 and kl[-1] > 1e-3, kl
    agreement = series(run, "train/token_mult_prob_error")  # the built-in sampler samples the adapted policy
    assert len(agreement) == 16 and all(1.0 <= x < 1.001 for x in agreement), agreement
    meta = artifact_metadata(run)
    assert meta["type"] == "checkpoint_megatron" and meta["lora_adapter"] == ".rlsteps/runs/rl_reinforce-tiny/adapter"
    trained, initial = weights(run / "policy"), weights(tiny_world.policy_megatron)  # what the next step reads
    assert trained.keys() == initial.keys() and any(not torch.equal(trained[k], initial[k]) for k in trained)
    learned = adapters(run)
    assert learned and all(".lora_A." in k or ".lora_B." in k for k in learned)
    checkpoint = run / "checkpoints" / "step_16" / "state"
    size = sum(f.stat().st_size for f in checkpoint.iterdir())
    # the adapters and their two moments (and DCP's headers): less than one copy of the base, where a full
    # fine-tuning checkpoint holds three (weights and two moments)
    assert size < sum(t.numel() * 4 for t in initial.values()), size


def test_a_lora_run_killed_after_a_checkpoint_resumes_to_the_same_bits(tiny_world, tmp_path):
    short = [
        *LORA,
        "rollout.prompts_per_step=8",
        "train.max_steps=4",
        "checkpoint.interval=2",
        "validation.interval=0",
        *FAST,
    ]
    a, b = straight_and_resumed("rl/rlhf", "rl_rlhf", short, tmp_path)
    for one, other in ((adapters(a), adapters(b)), (weights(a / "policy"), weights(b / "policy"))):
        assert one.keys() == other.keys()
        assert all(torch.equal(one[k], other[k]) for k in one), [k for k in one if not torch.equal(one[k], other[k])]
    assert series(a, "train/reward") == series(b, "train/reward")


def test_target_modules_that_match_no_layer_stop_the_run_in_one_line_with_the_layers_there_are(tiny_world, tmp_path):
    done = rlsteps("run", "rl/rs", "-c", "tiny", "train.lora.enabled=true", "train.lora.target_modules=[query]",
                   *FAST, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "train.lora.target_modules ['query'] matches no layer of the policy (fix: name some of" in done.stderr
    assert "'q_proj'" in done.stderr and "Traceback" not in done.stderr
    assert not (run_dir(tmp_path, "rl_rs") / "checkpoints").exists()
