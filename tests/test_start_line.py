"""The line a run starts with says how many steps it makes and how much of the data they go through without a
contradiction (it once read "8 steps (train.max_steps) over 256 prompts at 16 per step: 1 epoch(s) of 16 steps")."""

from __future__ import annotations

import pytest

from rlsteps.engine.run.loop import planned_steps
from test_loop_stats import _recipe_config


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        (8, "8 steps (train.max_steps), half of one epoch: 256 prompts at 16 per step make 16 steps an epoch"),
        (3, "3 steps (train.max_steps), 3/16 of one epoch: 256 prompts at 16 per step make 16 steps an epoch"),
        (16, "16 steps (train.max_steps), one epoch: 256 prompts at 16 per step make 16 steps an epoch"),
        (40, "40 steps (train.max_steps), 2.5 epochs: 256 prompts at 16 per step make 16 steps an epoch"),
    ],
)
def test_the_start_line_says_the_steps_and_the_share_of_an_epoch_they_make(steps, said):
    lines: list[str] = []
    for max_epochs in (None, 3):  # a max_epochs the steps stay within changes nothing
        lines.clear()
        assert planned_steps(_recipe_config(max_steps=steps, max_epochs=max_epochs), 256, lines.append) == steps
        assert lines == [said] and "epoch(s)" not in said
