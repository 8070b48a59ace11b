import pytest

from rlsteps.engine.run.loop import planned_steps
from rlsteps.engine.run.update import StepStats


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


def test_two_processes_shares_of_one_optimizer_step_merge_into_the_global_statistics():
    # a 40-token global batch: 30 tokens on process 0, 10 on process 1 (weights are shares of all 40)
    first, second = StepStats(), StepStats()
    first.add({"loss": 0.3, "tokens": 30, "ratio_mean": 1.0, "ratio_max": 1.5, "ratio_min": 0.9}, weight=30 / 40)
    second.add({"loss": 0.1, "tokens": 10, "ratio_mean": 2.0, "ratio_max": 1.2, "ratio_min": 0.5}, weight=10 / 40)
    first.end_optimizer_step(grad_norm=2.0)
    second.end_optimizer_step(grad_norm=2.0)  # the global norm: the same on both
    merged = StepStats.merge([first, second]).result()
    assert merged["train/loss"] == pytest.approx(0.4)
    assert merged["train/ratio_mean"] == pytest.approx(1.25)  # 0.75 * 1 + 0.25 * 2: as one process would say
    assert merged["train/ratio_max"] == 1.5 and merged["train/ratio_min"] == 0.5
    assert merged["train/grad_norm"] == 2.0


def test_no_optimizer_step_gives_no_loss_statistics():
    assert StepStats().result() == {}


def _recipe_config(**train):
    from rlsteps.contract.config import RSConfig

    return RSConfig.model_validate(
        {
            "algorithm": "rs",
            "inputs": {"prompts": "p.jsonl", "policy": "pol"},
            "output": {"dir": "out"},
            "rollout": {"prompts_per_step": 16, "top_n_rollouts": 1},
            "train": train,
        }
    )


def test_max_steps_runs_in_full_unless_a_set_max_epochs_ends_the_data_first_and_says_so(caplog):
    said = []
    # 256 prompts at 16 per step: 16 steps per epoch
    assert planned_steps(_recipe_config(max_steps=40), 256, said.append) == 40  # max_epochs unset: 3 epochs
    assert said == ["40 steps (train.max_steps), 2.5 epochs: 256 prompts at 16 per step make 16 steps an epoch"]
    assert planned_steps(_recipe_config(max_steps=40, max_epochs=3), 256, said.append) == 40
    with caplog.at_level("WARNING"):
        assert planned_steps(_recipe_config(max_steps=40, max_epochs=1), 256, said.append) == 16
    assert "running 16 steps, not train.max_steps=40" in caplog.text and "set train.max_epochs=3" in caplog.text
