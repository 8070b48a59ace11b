"""The resume state: step checkpoints that survive a kill at any moment, and resume exactly.

Layout under the root directory:

    step_<N>/
      state/                the training run's weights and optimizer state (torch.distributed.checkpoint,
                            written by every process: engine.train_state), or
      policy/               weights + tokenizer (HF safetensors; a one-process writer is pluggable)
      trainer_state.pt      scheduler state dict, RNG states (and the optimizer's, without state/)
      training_info.json    step, consumed_samples, epoch, optimizer_steps, metrics, created
      COMPLETE              written last: a directory without it is not a checkpoint

A save writes `tmp_step_<N>/`, fsyncs it, then renames it to `step_<N>/`: a kill leaves either the
old state or the new one, never a half-written `step_<N>/`. A checkpoint being replaced or pruned
is first renamed to `trash_step_<N>/`; the next save removes leftovers of interrupted saves and
puts back a trashed checkpoint whose replacement never arrived.

Pruning keeps the `keep_last` newest and the `keep_top_k` best by a metric. Saving step N also
removes any step_<M> with M > N: those belong to a run that this one superseded by resuming from
an earlier checkpoint, and `latest()` must not hand them to the next resume.

A save first checks that the disk has room for it (the latest checkpoint's size, or `size_hint` before the
first); a save that fails (a full disk, anything) removes its `tmp_step_<N>/` and a full disk is raised as
DiskFull, naming the directory and what to free.

The run's records follow the checkpoint it resumes from (rewind.py): metrics.jsonl and
samples.jsonl are cut back to the records of steps <= its step, a torn last line dropped, and the run's log
(train.log) loses the per-step lines of later steps, so a resumed run's records read as if it never stopped.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlsteps.contract import disk
from rlsteps.contract.checkpoint_damage import POLICY_DIR, REQUIRED_INFO, STATE_DIR, TRAINER_STATE, TRAINING_INFO
from rlsteps.contract.file_digests import write_digests
from rlsteps.contract.run_files import (
    COMPLETE,
    checkpoint_step,
    complete_checkpoints,
    next_checkpoint_bytes,
)
from rlsteps.engine.distributed import SINGLE, World, barrier, from_main
from rlsteps.engine.records.metrics import to_json_number
from rlsteps.errors import DiskFull

logger = logging.getLogger(__name__)

TMP_PREFIX = "tmp_"  # tmp_step_<N>: a save in progress
TRASH_PREFIX = "trash_"  # trash_step_<N>: a checkpoint being replaced or pruned


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or unreadable."""


@dataclass
class LoadedCheckpoint:
    policy_dir: Path  # policy/ (pass to from_pretrained), or state/ (read with engine.train_state)
    trainer_state: dict  # {"optimizer": ..., "scheduler": ..., "rng": ..., ...}
    info: dict  # training_info.json


# ---------------------------------------------------------------------------- RNG


def capture_rng_state() -> dict:
    """Every RNG a training step draws from: python, numpy, torch CPU and (when present) CUDA."""
    import numpy as np
    import torch

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda")
    if cuda_states and torch.cuda.is_available():
        if len(cuda_states) != torch.cuda.device_count():
            logger.warning(
                "checkpoint has CUDA RNG states for %d devices, this process sees %d; restoring the first ones",
                len(cuda_states),
                torch.cuda.device_count(),
            )
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])


# ---------------------------------------------------------------------------- manager


class CheckpointManager:
    """Saves `step_<N>/` checkpoints atomically under `root` and keeps the newest and the best.

    keep_last: how many of the newest checkpoints to keep (>= 1).
    keep_top_k: how many of the best by `info["metrics"][metric]` to keep as well.
    mode: "max" (higher metric is better) or "min".
    size_hint: the bytes a checkpoint will take, for the room check before the first one exists (then the
    latest checkpoint's size is used).
    """

    def __init__(
        self,
        root: Path,
        keep_last: int = 2,
        keep_top_k: int = 0,
        metric: str | None = None,
        mode: str = "max",
        size_hint: int | None = None,
    ):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (the newest checkpoint is what resume uses), got {keep_last}")
        if keep_top_k < 0:
            raise ValueError(f"keep_top_k must be >= 0, got {keep_top_k}")
        if keep_top_k > 0 and metric is None:
            raise ValueError("keep_top_k > 0 needs a metric to rank by: set metric (e.g. 'val/reward')")
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.root = Path(root)
        self.keep_last, self.keep_top_k, self.metric, self.mode = keep_last, keep_top_k, metric, mode
        self.size_hint = size_hint

    def needed_bytes(self) -> int:
        """What the next checkpoint takes on disk: the latest one's size, else the size hint (0 without one)."""
        return next_checkpoint_bytes(self.root, self.size_hint)

    def check_room(self, world: World = SINGLE) -> None:
        """DiskFull on every process when the disk of `root` has no room for the next checkpoint."""
        problem = None
        if world.is_main:
            try:
                disk.check_room(self.root, self.needed_bytes())
            except DiskFull as error:
                problem = error
        problem = from_main(world, problem)
        if problem is not None:
            raise problem

    def save(
        self,
        step: int,
        model: Any,
        tokenizer: Any,
        trainer_state: dict,
        info: dict,
        write_policy: Callable[[Path], None] | None = None,
        write_state: Callable[[Path], None] | None = None,
        world: World = SINGLE,
    ) -> Path:
        """Write `step_<step>/` atomically, then prune (see the module doc). Returns the checkpoint directory.

        trainer_state: optimizer/scheduler state dicts and anything else to resume; the RNG
        states are captured here unless it already has an "rng" entry.
        info: consumed_samples, epoch, optimizer_steps, metrics (optional), any extra JSON fields.
        write_policy: writes the policy into the directory it is given; by default the model's
        and tokenizer's save_pretrained.
        write_state: instead, writes the whole training state into state/; every process of `world` calls
        save, and every one runs write_state (a collective); the main process does the rest.
        """
        training_info = _training_info(step, info)
        tmp = self.root / f"{TMP_PREFIX}step_{step}"
        if world.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            self._clean_interrupted_saves()
        need = self.needed_bytes() if world.is_main else 0
        self.check_room(world)
        if world.is_main:
            tmp.mkdir()
        barrier(world)
        final = self.root / f"step_{step}"
        try:
            if write_state is not None:
                write_state(tmp / STATE_DIR)
                barrier(world)
            if world.is_main:
                if write_state is None:
                    (write_policy or _hf_policy_writer(model, tokenizer))(tmp / POLICY_DIR)
                self._complete(tmp, final, trainer_state, training_info)
        except Exception as error:
            if not world.is_main:
                raise
            # ENOSPC, or a writer (torch's) that reports a failed write without it while the rest did not fit
            full = disk.is_disk_full(error) or disk.free_bytes(self.root) < need - _bytes_in(tmp)
            shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays behind
            if full:
                raise disk.disk_full(self.root, need=need, what=f"checkpoint step_{step}") from error
            raise
        barrier(world)
        return final

    def _complete(self, tmp: Path, final: Path, trainer_state: dict, training_info: dict) -> None:
        import torch  # here, not at the top: finding checkpoints (list, latest) is torch-free

        torch.save({"rng": capture_rng_state(), **trainer_state}, tmp / TRAINER_STATE)
        (tmp / TRAINING_INFO).write_text(json.dumps(training_info, indent=2, allow_nan=False) + "\n")
        write_digests(tmp)  # every file's SHA-256: a resume trusts the content, not only the sizes
        _fsync_tree(tmp)
        _write_durably(tmp / COMPLETE, training_info["created"] + "\n")
        if final.exists():
            trash = self.root / f"{TRASH_PREFIX}{final.name}"
            os.replace(final, trash)
            os.replace(tmp, final)
            _fsync_dir(self.root)
            _remove_checkpoint_dir(trash)
        else:
            os.replace(tmp, final)
            _fsync_dir(self.root)
        logger.info("saved checkpoint %s", final)
        self._prune(keep=final)

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest step first."""
        return complete_checkpoints(self.root)

    def latest(self) -> Path | None:
        checkpoints = self.list()
        return checkpoints[-1] if checkpoints else None

    def best(self) -> Path | None:
        ranked = self._ranked_by_metric()
        return ranked[0] if ranked else None

    def load(self, path: Path) -> LoadedCheckpoint:
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(
                f"checkpoint {path} does not exist; available under {self.root}: {[p.name for p in self.list()]}"
            )
        if not (path / COMPLETE).is_file():
            raise CheckpointError(
                f"checkpoint {path} is incomplete (no {COMPLETE} marker: its save was "
                "interrupted); resume from CheckpointManager.latest() instead"
            )
        info = _read_training_info(path / TRAINING_INFO)
        state_file = path / TRAINER_STATE
        try:
            # weights_only=False: trainer_state.pt holds numpy RNG state and arbitrary optimizer and
            # scheduler state, which the weights-only unpickler rejects. It is safe only because we
            # wrote this file ourselves; never load a trainer_state.pt from an untrusted source.
            import torch

            trainer_state = torch.load(state_file, map_location="cpu", weights_only=False)
        except Exception as error:
            raise CheckpointError(
                f"cannot read {state_file}: {type(error).__name__}: {error}. The file is "
                "missing or corrupt; move this checkpoint aside (damaged_step_N) to resume from the one before it"
            ) from error
        policy_dir = path / STATE_DIR if (path / STATE_DIR).is_dir() else path / POLICY_DIR
        if not policy_dir.is_dir():
            raise CheckpointError(
                f"checkpoint {path} has neither {STATE_DIR}/ nor {POLICY_DIR}/; it was not written by "
                "CheckpointManager.save or has been damaged"
            )
        return LoadedCheckpoint(policy_dir=policy_dir, trainer_state=trainer_state, info=info)

    def _ranked_by_metric(self) -> list[Path]:
        """Checkpoints that logged the metric, best first (ties: the newer first)."""
        if self.metric is None:
            return []
        scored = []
        for path in self.list():
            value = _read_training_info(path / TRAINING_INFO).get("metrics", {}).get(self.metric)
            if value is not None:
                scored.append(((value if self.mode == "max" else -value), checkpoint_step(path), path))
        return [path for *_, path in sorted(scored, reverse=True)]

    def _prune(self, keep: Path) -> None:
        # Checkpoints after the one just written belong to a run this one superseded (it resumed
        # from an earlier step); left in place, latest() would resume the abandoned run.
        for path in self.list():
            if checkpoint_step(path) > checkpoint_step(keep):
                logger.warning("removing %s: superseded by %s (this run resumed from an earlier step)", path, keep)
                self._delete(path)
        checkpoints = self.list()
        kept = {keep, *checkpoints[-self.keep_last :], *self._ranked_by_metric()[: self.keep_top_k]}
        for path in checkpoints:
            if path not in kept:
                self._delete(path)
                logger.info("pruned checkpoint %s", path)

    def _delete(self, path: Path) -> None:
        trash = self.root / f"{TRASH_PREFIX}{path.name}"
        os.replace(path, trash)
        _remove_checkpoint_dir(trash)

    def _clean_interrupted_saves(self) -> None:
        for path in sorted(self.root.glob(f"{TMP_PREFIX}step_*")):
            logger.warning("removing %s: left by a save that was interrupted", path)
            shutil.rmtree(path)
        for trash in sorted(self.root.glob(f"{TRASH_PREFIX}step_*")):
            original = self.root / trash.name.removeprefix(TRASH_PREFIX)
            if not original.exists() and (trash / COMPLETE).is_file():
                logger.warning("restoring %s: its replacement was interrupted", original)
                os.replace(trash, original)
            else:
                _remove_checkpoint_dir(trash)
        _fsync_dir(self.root)


# ---------------------------------------------------------------------------- helpers


def _training_info(step: int, info: dict) -> dict:
    missing = [key for key in REQUIRED_INFO if key not in info]
    if missing:
        raise ValueError(
            f"checkpoint info lacks {missing}; resume needs them: pass "
            f"consumed_samples, epoch and optimizer_steps in info"
        )
    if info.get("step", step) != step:
        raise ValueError(f"info['step'] = {info['step']} disagrees with step = {step}")
    metrics = {key: to_json_number(value) for key, value in info.get("metrics", {}).items()}
    created = datetime.now(UTC).isoformat(timespec="seconds")
    return {"step": step, **info, "metrics": metrics, "created": created}


def _hf_policy_writer(model: Any, tokenizer: Any) -> Callable[[Path], None]:
    if model is None:
        raise ValueError("save() needs a model, or a write_policy that writes the policy itself")

    def write(policy_dir: Path) -> None:
        # safetensors: the default since transformers 4.35 and the only format in 5.x.
        model.save_pretrained(policy_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(policy_dir)

    return write


def _read_training_info(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(
            f"cannot read {path}: {error}. The checkpoint is damaged; move it aside (damaged_step_N) to resume from "
            "the one before it"
        ) from error


def _bytes_in(directory: Path) -> int:
    return disk.tree_bytes(directory) if directory.is_dir() else 0


def _remove_checkpoint_dir(path: Path) -> None:
    """Drop the marker first: a kill halfway through rmtree leaves a directory nobody mistakes for a checkpoint."""
    (path / COMPLETE).unlink(missing_ok=True)
    _fsync_dir(path)
    shutil.rmtree(path)


def _write_durably(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(path.parent)


def _fsync_tree(root: Path) -> None:
    """fsync every file, then every directory (deepest first), so the data is on disk before the rename."""
    directories = []
    for directory, _, files in os.walk(root):
        directories.append(directory)
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for directory in reversed(directories):
        _fsync_dir(Path(directory))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
