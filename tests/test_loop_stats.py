import pytest

from rlsteps.engine.loop import StepStats


def test_losses_add_up_extremes_keep_extremes_and_means_are_token_weighted():
    stats = StepStats()
    # one optimizer step of two micro-batches: 30 and 10 tokens of a 40-token global batch
    stats.add({"loss": 0.3, "tokens": 30, "ratio_mean": 1.0, "ratio_max": 1.5, "ratio_min": 0.9}, weight=30 / 40)
    stats.add({"loss": 0.1, "tokens": 10, "ratio_mean": 2.0, "ratio_max": 1.2, "ratio_min": 0.5}, weight=10 / 40)
    stats.end_optimizer_step(grad_norm=2.0)
    # a second optimizer step
    stats.add({"loss": 0.2, "tokens": 5, "ratio_mean": 1.0, "ratio_max": 1.1, "ratio_min": 0.95}, weight=1.0)
    stats.end_optimizer_step(grad_norm=4.0)
    result = stats.result()
    assert result["train/loss"] == pytest.approx((0.4 + 0.2) / 2)
    assert result["train/ratio_mean"] == pytest.approx((1.25 + 1.0) / 2)  # (0.75*1 + 0.25*2) then averaged
    assert result["train/ratio_max"] == 1.5 and result["train/ratio_min"] == 0.5
    assert result["train/grad_norm"] == pytest.approx(3.0)
    assert "train/tokens" not in result


def test_no_optimizer_step_gives_no_loss_statistics():
    assert StepStats().result() == {}
