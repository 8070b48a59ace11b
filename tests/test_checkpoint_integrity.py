"""A checkpoint is checked before a run resumes from it, against what its own files say of themselves: a damaged one is
named, moved aside (never deleted), and the newest intact one is the run's latest; with none intact nothing moves
unless the user says to start over.

The checkpoints are real: written by CheckpointManager.save with the run's own writer of the weights and optimizer
state (torch.distributed.checkpoint), then damaged as a copy cut short or a disk that lost blocks would.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from rlsteps.contract.checkpoint_damage import checkpoint_damage
from rlsteps.engine.checkpoints.integrity import set_aside_damaged
from rlsteps.engine.checkpoints.resume import CheckpointError, CheckpointManager
from rlsteps.engine.checkpoints.train_state import write_train_state


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A run's checkpoints step_1 and step_2 of a small model and its AdamW state, written once."""
    root = tmp_path_factory.mktemp("saved") / "checkpoints"
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    manager = CheckpointManager(root)
    for step in (1, 2):
        info = {"consumed_samples": 4 * step, "epoch": 0, "optimizer_steps": step}
        write = lambda folder: write_train_state(model, optimizer, folder)  # noqa: E731
        manager.save(step, model, None, {"scheduler": {}}, info, write_state=write)
    return root


@pytest.fixture
def checkpoints(saved, tmp_path) -> CheckpointManager:
    root = tmp_path / "checkpoints"
    shutil.copytree(saved, root)
    return CheckpointManager(root)


def cut(path: Path, keep: int | None = None) -> None:
    os.truncate(path, path.stat().st_size // 2 if keep is None else keep)


def overwrite(path: Path) -> None:
    """Bytes in the middle of the file replaced, its length kept: what a disk that returns other blocks does."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


DAMAGE = {  # what is done to step_2, and the words its damage is named with
    "a shard cut short": (lambda c: cut(next((c / "state").glob("*.distcp"))), ".distcp is cut short"),
    "a shard gone": (lambda c: next((c / "state").glob("*.distcp")).unlink(), ".distcp is absent"),
    "the state's index cut short": (lambda c: cut(c / "state" / ".metadata"), ".metadata is cut short or broken"),
    "the state's index gone": (lambda c: (c / "state" / ".metadata").unlink(), "has no .metadata"),
    "trainer_state.pt cut short": (lambda c: cut(c / "trainer_state.pt"), "trainer_state.pt is cut short"),
    "trainer_state.pt emptied": (lambda c: cut(c / "trainer_state.pt", 0), "trainer_state.pt is empty"),
    "training_info.json cut short": (lambda c: cut(c / "training_info.json"), "training_info.json is not JSON"),
    "a shard overwritten in place": (
        lambda c: overwrite(next((c / "state").glob("*.distcp"))),
        ".distcp does not hold the bytes that were written",
    ),
    "trainer_state.pt overwritten in place": (
        lambda c: overwrite(c / "trainer_state.pt"),
        "trainer_state.pt does not hold the bytes that were written",
    ),
    "training_info.json without its counters": (
        lambda c: (c / "training_info.json").write_text('{"step": 2}'),
        "lacks consumed_samples, epoch, optimizer_steps",
    ),
}


def test_whole_checkpoints_have_no_damage(checkpoints):
    assert [checkpoint_damage(path) for path in checkpoints.list()] == [None, None]


@pytest.mark.parametrize("name", list(DAMAGE))
def test_damage_is_named_with_the_file_and_the_newest_intact_checkpoint_becomes_the_latest(name, checkpoints, caplog):
    damage, words = DAMAGE[name]
    step_2 = checkpoints.root / "step_2"
    damage(step_2)
    assert words in checkpoint_damage(step_2)

    said: list[str] = []
    set_aside_damaged(checkpoints, start_over=False, say=said.append)
    [line] = said
    assert line.startswith("checkpoint step_2 is damaged (") and words in line, line
    assert line.endswith(f"moved aside to {checkpoints.root / 'damaged_step_2'}; resuming from step_1"), line
    assert checkpoints.latest() == checkpoints.root / "step_1"
    assert (checkpoints.root / "damaged_step_2" / "COMPLETE").is_file()  # moved whole, never deleted


def test_with_none_intact_nothing_moves_and_the_error_says_how_to_start_over(checkpoints):
    for step in (1, 2):
        cut(checkpoints.root / f"step_{step}" / "trainer_state.pt")
    before = sorted(p.name for p in checkpoints.root.iterdir())
    with pytest.raises(CheckpointError) as refused:
        set_aside_damaged(checkpoints, start_over=False, say=pytest.fail)
    message = str(refused.value)
    assert message.startswith(f"checkpoint {checkpoints.root / 'step_2'} is damaged (") and "\n" not in message
    assert (
        "no intact checkpoint is left to resume from (fix: rerun with checkpoint.start_over_if_damaged=true" in message
    )
    assert sorted(p.name for p in checkpoints.root.iterdir()) == before

    said: list[str] = []
    set_aside_damaged(checkpoints, start_over=True, say=said.append)
    assert [line.split(" is damaged")[0] for line in said] == ["checkpoint step_2", "checkpoint step_1"]
    assert all(line.endswith("starting over (checkpoint.start_over_if_damaged=true)") for line in said), said
    assert checkpoints.latest() is None
    assert sorted(p.name for p in checkpoints.root.iterdir()) == ["damaged_step_1", "damaged_step_2"]


def test_a_second_damaged_copy_of_a_step_is_kept_beside_the_first(checkpoints):
    (checkpoints.root / "damaged_step_2").mkdir()
    cut(checkpoints.root / "step_2" / "trainer_state.pt")
    set_aside_damaged(checkpoints, start_over=False, say=lambda line: None)
    assert (checkpoints.root / "damaged_step_2.2" / "COMPLETE").is_file()


def test_only_the_newest_are_checked_and_an_older_damaged_one_stays(checkpoints):
    cut(checkpoints.root / "step_1" / "trainer_state.pt")
    said: list[str] = []
    set_aside_damaged(checkpoints, start_over=False, say=said.append)
    assert said == [] and checkpoints.latest() == checkpoints.root / "step_2"
