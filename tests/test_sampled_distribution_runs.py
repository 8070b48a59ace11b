"""A run sampling at temperature 0.7 or 1.3 (with top-k and top-p) scores its tokens under the distribution it sampled
from on both sides: the sampler's log-probs and the trainer's agree (train/token_mult_prob_error 1.0 to float
tolerance), the built-in sampler's here. That both are the sampled distribution's, and not the raw model's, is shown
where it can be seen: tests/test_generation.py (the sampler's), tests/test_logprobs.py (the trainer's) and
tests/test_oracle_maths.py (NeMo-RL's own). Before, both sides scored the raw (T=1) distribution: this metric read
1.0 (measured: 1.0000005 at T 0.7 and 1.3) while the gradient was that of another objective."""

from __future__ import annotations

import pytest

from run_helpers import FAST, rlsteps, run_dir, series

pytestmark = pytest.mark.slow

TWO_STEPS = ["train.max_steps=2", "validation.interval=0", "checkpoint.interval=0", *FAST]
SETTINGS = {
    "T0.7": ["rollout.sampling.temperature=0.7"],
    "T1.3": ["rollout.sampling.temperature=1.3"],
    "T0.7-k20-p0.9": ["rollout.sampling.temperature=0.7", "rollout.sampling.top_k=20", "rollout.sampling.top_p=0.9"],
}
FLOAT_TOLERANCE = 1e-4  # fp32 log-probs of one model in two batch shapes


@pytest.mark.parametrize("step", ["rl/reinforce", "rl/rlhf"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_the_sampler_and_the_trainer_score_the_same_distribution(tiny_world, tmp_path, step, setting):
    extra = ["rollout.sampling.top_k=20"] if step == "rl/rlhf" and setting == "T1.3" else []
    done = rlsteps("run", step, "-c", "tiny", *TWO_STEPS, *SETTINGS[setting], *extra, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = series(run_dir(tmp_path, step.replace("/", "_")), "train/token_mult_prob_error")
    assert len(errors) == 2 and all(abs(e - 1.0) < FLOAT_TOLERANCE for e in errors), errors
