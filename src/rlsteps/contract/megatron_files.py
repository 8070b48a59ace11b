"""A checkpoint_megatron's names: the tracker file, the iteration folders, the tokenizer beside the torch_dist files,
and where a checkpoint's torch_dist folder lies (on any fsspec filesystem). Torch-free: the command line finds
checkpoints through it; rlsteps.engine.megatron reads and writes them."""

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
