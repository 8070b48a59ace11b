"""Each model family users bring trains with vLLM's CPU build sampling its rollouts (rollout.backend=vllm, in the
.venv-vllm environment; see test_vllm_rollouts.py): a two-step rl/reinforce per family, vLLM's log-probs the
trainer's, before and after each weight sync (train/token_mult_prob_error within 1% of 1). vLLM's CPU attention
takes head sizes of 32 and up, so these families are built at head_dim 32 (hidden 128); a policy of head size 16 is
refused before vLLM starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from run_helpers import rlsteps, run_dir, series
from test_family_runs import FAMILY_NAMES, TWO_STEPS, family_policy, two_step_run
from vllm_judge import vllm_python

pytestmark = pytest.mark.slow

VLLM_ROLLOUTS = ["rollout.backend=vllm", "rollout.vllm.enforce_eager=true", "rollout.vllm.kv_cache_gb=1"]
VLLM_SHAPE = {"hidden_size": 128, "head_dim": 32}  # 4 heads of 32: the head size vLLM's CPU kernels take
# Gemma 3 scales its queries by query_pre_attn_scalar ** -0.5, the head size in its own configs
FAMILY_FIELDS = {"gemma3": {"query_pre_attn_scalar": 32}}


@pytest.fixture(scope="module")
def vllm_policies(tiny_world, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vllm_families")
    return {
        family: family_policy(family, tiny_world.policy, root / family, **VLLM_SHAPE, **FAMILY_FIELDS.get(family, {}))
        for family in FAMILY_NAMES
    }


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_two_step_run_trains_each_family_on_vllms_rollouts(family, vllm_policies, tmp_path):
    run = two_step_run(family, vllm_policies[family], tmp_path / "run", *VLLM_ROLLOUTS, python=vllm_python())
    assert not list(run.glob(".rollout-model-*"))


def test_a_head_size_vllms_cpu_build_lacks_is_refused_before_vllm_starts(tiny_world, tmp_path):
    policy = family_policy("llama3", tiny_world.policy, tmp_path / "llama3")  # head_dim 16
    done = rlsteps("run", "rl/reinforce", "-c", "tiny", f"inputs.policy={policy}", *TWO_STEPS, *VLLM_ROLLOUTS,
                   cwd=tmp_path, python=vllm_python())  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "vLLM's CPU build has no attention kernel for this policy's head size 16 (it takes 32, 64" in done.stderr
    assert "fix: rollout.backend=builtin" in done.stderr and "Traceback" not in done.stderr
    assert not (run_dir(tmp_path, "rl_reinforce") / "metrics.jsonl").exists()


def test_vllm_at_temperature_0_7_with_top_k_and_top_p_gives_the_log_probs_training_scores(vllm_policies, tmp_path):
    """vLLM's processed log-probs (temperature, top-k, top-p applied) are the trainer's under the sampled
    distribution, to float tolerance: its raw ones, which it gave before, differ by the temperature's whole effect."""
    sampled = ["rollout.sampling.temperature=0.7", "rollout.sampling.top_k=20", "rollout.sampling.top_p=0.9"]
    done = rlsteps("run", "rl/reinforce", "-c", "tiny", f"inputs.policy={vllm_policies['qwen3']}", *TWO_STEPS,
                   *VLLM_ROLLOUTS, *sampled, cwd=tmp_path, python=vllm_python())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    errors = series(run_dir(tmp_path, "rl_reinforce"), "train/token_mult_prob_error")
    assert errors and all(abs(e - 1.0) < 1e-4 for e in errors), errors  # a step without an update logs none
