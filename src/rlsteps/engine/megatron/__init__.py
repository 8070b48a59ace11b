"""checkpoint_megatron: Megatron-Core distributed checkpoints of Hugging Face causal LMs.

layout.py maps tensor names and layouts, format.py reads and writes the folders through
megatron.core.dist_checkpointing, compat.py lets that run on a CPU in one process, common_state.py finds the
common state where a later megatron-core (and so Megatron-Bridge) keeps it, and gpt_model.py
loads a checkpoint into megatron-core's own GPTModel to check it. This module itself is torch-free:
the command line finds checkpoints (on any fsspec filesystem) through it.
"""

from __future__ import annotations

import json

TRACKER_FILE = "latest_checkpointed_iteration.txt"  # Megatron-LM's pointer to the latest iter_* folder
DIST_METADATA = "metadata.json"  # written by dist_checkpointing.save: {"sharded_backend": "torch_dist", ...}
TOKENIZER_DIR = "tokenizer"  # beside the torch_dist files: the Hugging Face tokenizer this package saves with them


def iteration_folder(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def find_checkpoint_dir(fs, path: str) -> tuple[str | None, str]:
    """(the torch_dist folder, "") for a checkpoint root (through its tracker file, else its newest iter_* folder)
    or for that folder itself; (None, why not) for anything else. `fs` is an fsspec filesystem."""
    path = path.rstrip("/")
    if _is_torch_dist(fs, path):
        return path, ""
    tracker = f"{path}/{TRACKER_FILE}"
    if fs.isfile(tracker):
        text = fs.cat_file(tracker).decode(errors="replace").strip()
        if text != "release" and not text.isdigit():
            return None, f"{tracker} says {text!r}: expected an iteration number or 'release'"
        candidate = f"{path}/{'release' if text == 'release' else iteration_folder(int(text))}"
        if _is_torch_dist(fs, candidate):
            return candidate, ""
        return (
            None,
            f"{tracker} points at {candidate}, which is not a Megatron distributed checkpoint (no {DIST_METADATA})",
        )
    iterations = sorted(p for p in fs.glob(f"{path}/iter_*") if _is_torch_dist(fs, p))
    if iterations:
        return iterations[-1], ""
    return None, f"{path} is not a Megatron checkpoint: no {DIST_METADATA}, no {TRACKER_FILE}, no iter_* folder"


def _is_torch_dist(fs, folder: str) -> bool:
    target = f"{folder}/{DIST_METADATA}"
    if not fs.isfile(target):
        return False
    try:
        return json.loads(fs.cat_file(target)).get("sharded_backend") == "torch_dist"
    except (ValueError, AttributeError):
        return False
