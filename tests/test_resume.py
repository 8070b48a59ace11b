import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from model_fixtures import decoder_shape
from rlsteps.engine.checkpoints.resume import CheckpointError, CheckpointManager, capture_rng_state, restore_rng_state

# ---------------------------------------------------------------------------- a tiny offline world


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(["<pad>", "<unk>", "</s>", *(f"w{i}" for i in range(29))])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32, **decoder_shape(hidden=16, layers=1, heads=2, positions=32))
    return LlamaForCausalLM(config)


def trained_optimizer(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW and a warmup schedule after one real step, so their states are not empty."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    tokens = torch.tensor([[3, 4, 5, 6, 2]])
    model(input_ids=tokens, labels=tokens).loss.backward()
    optimizer.step()
    scheduler.step()
    return optimizer, scheduler


def info(step: int, **metrics: float) -> dict:
    return {"consumed_samples": 8 * step, "epoch": 0, "optimizer_steps": step, "metrics": metrics}


def write_stub_policy(text: str = "weights"):
    def write(policy_dir: Path) -> None:
        policy_dir.mkdir()
        (policy_dir / "weights.txt").write_text(text)

    return write


def save_stub(manager: CheckpointManager, step: int, text: str = "weights", **metrics: float) -> Path:
    return manager.save(step, None, None, {}, info(step, **metrics), write_policy=write_stub_policy(text))


def steps(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def rng_draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


# ---------------------------------------------------------------------------- round trip


def test_round_trip_restores_weights_optimizer_scheduler_tokenizer_and_rng(tmp_path):
    model, tokenizer = tiny_model(), tiny_tokenizer()
    optimizer, scheduler = trained_optimizer(model)
    manager = CheckpointManager(tmp_path / "ckpt")
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    path = manager.save(1, model, tokenizer, state, info(1, **{"val/reward": 0.25}))
    draws_after_save = rng_draws()
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)

    loaded = manager.load(path)
    restore_rng_state(loaded.trainer_state["rng"])
    assert rng_draws() == draws_after_save

    assert (loaded.policy_dir / "model.safetensors").is_file()
    restored = AutoModelForCausalLM.from_pretrained(loaded.policy_dir)
    for (name, want), (_, got) in zip(model.state_dict().items(), restored.state_dict().items(), strict=True):
        assert torch.equal(want, got), name

    new_optimizer = torch.optim.AdamW(restored.parameters(), lr=1e-3)
    new_scheduler = torch.optim.lr_scheduler.LambdaLR(new_optimizer, lambda step: min(1.0, (step + 1) / 10))
    new_optimizer.load_state_dict(loaded.trainer_state["optimizer"])
    new_scheduler.load_state_dict(loaded.trainer_state["scheduler"])
    for want, got in zip(optimizer.state.values(), new_optimizer.state.values(), strict=True):
        assert torch.equal(want["exp_avg"], got["exp_avg"]) and torch.equal(want["exp_avg_sq"], got["exp_avg_sq"])
    assert new_scheduler.last_epoch == scheduler.last_epoch == 1
    assert new_scheduler.get_last_lr() == scheduler.get_last_lr()

    assert AutoTokenizer.from_pretrained(loaded.policy_dir)("w1 w2 w3").input_ids == tokenizer("w1 w2 w3").input_ids
    assert loaded.info["step"] == 1 and loaded.info["consumed_samples"] == 8 and loaded.info["optimizer_steps"] == 1
    assert loaded.info["metrics"] == {"val/reward": 0.25} and "created" in loaded.info
    assert (path / "COMPLETE").is_file() and steps(manager.list()) == ["step_1"]


def test_rng_capture_restore_repeats_the_draws():
    state = capture_rng_state()
    first = rng_draws()
    restore_rng_state(state)
    assert rng_draws() == first


def test_info_must_carry_the_resume_counters(tmp_path):
    manager = CheckpointManager(tmp_path)
    with pytest.raises(ValueError, match="consumed_samples"):
        manager.save(1, None, None, {}, {"epoch": 0}, write_policy=write_stub_policy())
    with pytest.raises(ValueError, match="needs a model"):
        manager.save(1, None, None, {}, info(1))
    assert manager.list() == []


def test_constructor_rejects_top_k_without_metric_and_bad_mode(tmp_path):
    with pytest.raises(ValueError, match="metric"):
        CheckpointManager(tmp_path, keep_top_k=1)
    with pytest.raises(ValueError, match="mode"):
        CheckpointManager(tmp_path, metric="m", mode="best")


# ---------------------------------------------------------------------------- pruning


def test_keep_last_keeps_the_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in range(1, 6):
        save_stub(manager, step)
    assert steps(manager.list()) == ["step_4", "step_5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_4", "step_5"]


# step 3 never logs the metric and step 5 logs NaN: neither may rank as best in either mode.
METRIC_BY_STEP = {1: 0.9, 2: 0.1, 3: None, 4: 0.5, 5: float("nan"), 6: 0.7}


def save_metric_series(manager: CheckpointManager) -> None:
    for step, value in METRIC_BY_STEP.items():
        save_stub(manager, step, **({} if value is None else {"val/reward": value}))


def test_keep_top_k_max_mode(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1, keep_top_k=1, metric="val/reward", mode="max")
    save_metric_series(manager)
    assert steps(manager.list()) == ["step_1", "step_6"]
    assert manager.best() == tmp_path / "step_1"


def test_keep_top_k_min_mode_ignores_missing_and_nan_metrics(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1, keep_top_k=2, metric="val/reward", mode="min")
    save_metric_series(manager)
    assert steps(manager.list()) == ["step_2", "step_4", "step_6"]
    assert manager.best() == tmp_path / "step_2"


def test_best_is_none_without_metric_values(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3, keep_top_k=1, metric="val/reward")
    save_stub(manager, 1, other=1.0)
    save_stub(manager, 2)
    assert manager.best() is None
    assert CheckpointManager(tmp_path).best() is None  # no metric configured
    assert steps(manager.list()) == ["step_1", "step_2"]


def test_saving_an_earlier_step_removes_the_superseded_later_ones(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, keep_last=10)
    for step in range(1, 5):
        save_stub(manager, step)
    with caplog.at_level(logging.WARNING, logger="rlsteps.engine.checkpoints.resume"):
        save_stub(manager, 2, text="resumed")
    assert steps(manager.list()) == ["step_1", "step_2"]
    assert manager.latest() == tmp_path / "step_2"
    assert "superseded" in caplog.text


def test_an_existing_step_is_replaced_without_leftovers(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=5)
    save_stub(manager, 3, text="first")
    save_stub(manager, 3, text="second")
    assert (tmp_path / "step_3" / "policy" / "weights.txt").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3"]


# ---------------------------------------------------------------------------- interrupted saves


def test_latest_ignores_incomplete_and_tmp_dirs(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=5)
    assert manager.latest() is None and manager.list() == []
    save_stub(manager, 1)
    save_stub(manager, 2)
    (tmp_path / "step_7" / "policy").mkdir(parents=True)  # no COMPLETE marker
    (tmp_path / "tmp_step_8").mkdir()
    (tmp_path / "tmp_step_8" / "COMPLETE").write_text("")
    (tmp_path / "step_x").mkdir()
    assert manager.latest() == tmp_path / "step_2"
    assert steps(manager.list()) == ["step_1", "step_2"]
    with pytest.raises(CheckpointError, match="incomplete"):
        manager.load(tmp_path / "step_7")


def test_next_save_restores_a_checkpoint_whose_replacement_was_interrupted(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, keep_last=5)
    for step in (1, 2, 3):
        save_stub(manager, step, text=f"step {step}")
    # A replacement of step_3 killed between its two renames: the old one sits in the trash,
    # the new one is still a tmp dir. A prune killed mid-delete leaves a trash without a marker.
    os.replace(tmp_path / "step_3", tmp_path / "trash_step_3")
    (tmp_path / "tmp_step_3" / "policy").mkdir(parents=True)
    os.replace(tmp_path / "step_1", tmp_path / "trash_step_1")
    (tmp_path / "trash_step_1" / "COMPLETE").unlink()
    assert manager.latest() == tmp_path / "step_2"

    with caplog.at_level(logging.WARNING, logger="rlsteps.engine.checkpoints.resume"):
        save_stub(manager, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_3", "step_4"]
    assert (tmp_path / "step_3" / "policy" / "weights.txt").read_text() == "step 3"
    assert "restoring" in caplog.text and "tmp_step_3" in caplog.text


def run_kill_worker(root: Path, ready: Path, expected: Path) -> None:
    """Runs in a subprocess: saves step 1, then hangs in the middle of saving step 2 until killed."""
    torch.set_num_threads(1)
    model, tokenizer = tiny_model(), tiny_tokenizer()
    optimizer, scheduler = trained_optimizer(model)
    save_file({name: t.contiguous() for name, t in model.state_dict().items()}, expected)
    manager = CheckpointManager(root)
    manager.save(1, model, tokenizer, {"optimizer": optimizer.state_dict()}, info(1))

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)

    def write_then_hang(policy_dir: Path) -> None:
        model.save_pretrained(policy_dir)  # part of step 2 is on disk...
        ready.write_text("writing")  # ...tell the test, then wait for SIGKILL
        time.sleep(600)

    manager.save(2, model, tokenizer, {"optimizer": optimizer.state_dict()}, info(2), write_policy=write_then_hang)


KILL_WORKER = (
    f"import pathlib, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    "from test_resume import run_kill_worker; run_kill_worker(*map(pathlib.Path, sys.argv[1:]))"
)


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_intact(tmp_path, caplog):
    root, ready, log = tmp_path / "ckpt", tmp_path / "ready", tmp_path / "worker.log"
    expected = tmp_path / "expected.safetensors"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-c", KILL_WORKER, str(root), str(ready), str(expected)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert worker.poll() is None, f"worker exited early:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"worker never reached step 2:\n{log.read_text()}"
            time.sleep(0.1)
        os.kill(worker.pid, signal.SIGKILL)
    finally:
        worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    assert (root / "tmp_step_2" / "policy" / "model.safetensors").is_file()  # the kill hit mid-save

    manager = CheckpointManager(root)
    assert manager.latest() == root / "step_1" and steps(manager.list()) == ["step_1"]
    loaded = manager.load(manager.latest())
    assert loaded.info["step"] == 1 and "optimizer" in loaded.trainer_state
    model = AutoModelForCausalLM.from_pretrained(loaded.policy_dir)
    want = load_file(expected)
    got = model.state_dict()
    assert set(want) == set(got)
    assert all(torch.equal(want[name], got[name]) for name in want)

    tokenizer = AutoTokenizer.from_pretrained(loaded.policy_dir)
    with caplog.at_level(logging.WARNING, logger="rlsteps.engine.checkpoints.resume"):
        manager.save(2, model, tokenizer, loaded.trainer_state, info(2))
    assert "tmp_step_2" in caplog.text and "interrupted" in caplog.text
    assert not (root / "tmp_step_2").exists()
    assert manager.latest() == root / "step_2"


# ---------------------------------------------------------------------------- damaged checkpoints


def test_corrupt_trainer_state_gives_an_error_naming_the_file(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = manager.save(
        1,
        None,
        None,
        {"optimizer": {"state": {}, "weights": torch.ones(64)}},
        info(1),
        write_policy=write_stub_policy(),
    )
    state_file = path / "trainer_state.pt"
    data = state_file.read_bytes()
    state_file.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(CheckpointError, match="trainer_state.pt") as error:
        manager.load(path)
    assert str(state_file) in str(error.value)
    state_file.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="corrupt"):
        manager.load(path)
    state_file.unlink()
    with pytest.raises(CheckpointError, match="trainer_state.pt"):
        manager.load(path)


def test_corrupt_training_info_and_missing_checkpoint_give_clear_errors(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = save_stub(manager, 1)
    (path / "training_info.json").write_text('{"step": 1, "consum')
    with pytest.raises(CheckpointError, match="training_info.json"):
        manager.load(path)
    with pytest.raises(CheckpointError, match="does not exist.*step_1"):
        manager.load(tmp_path / "step_9")
