"""Weight files cut short or broken, told from their headers and sizes alone, without reading a weight or importing
torch: a model folder (safetensors with their index, pytorch_model.bin), a Megatron checkpoint (torch_dist), and any
torch.distributed.checkpoint folder (its .metadata places each item in a file at an offset and a length)."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

from fsspec.core import url_to_fs

from rlsteps.contract.megatron_files import find_checkpoint_dir

SAFETENSORS_INDEX = "model.safetensors.index.json"
HEADER_LIMIT = 100_000_000  # safetensors' own bound on a header
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a torch_dist folder: each item's file and range
DCP_METADATA_LIMIT = 64 * 2**20  # read no larger index (a model of thousands of tensors and shards stays well below)
ZIP_END = b"PK\x05\x06"  # a zip file's end record: torch.save's files end with one


def weight_damage(ref: str) -> str | None:
    """What is wrong with a model folder's weight files, in words, or None.

    Found without reading a weight: a safetensors file shorter (or longer) than its header says, or without a
    header; a shard that model.safetensors.index.json names and the folder lacks; a torch zip file (pytorch_model.bin,
    a Megatron checkpoint's common.pt) without its end; a Megatron checkpoint without the index torch_dist writes
    last, or whose *.distcp files are absent or shorter than that index says."""
    fs, path = url_to_fs(ref)
    path = path.rstrip("/")
    try:
        if not fs.isdir(path):
            return None
        megatron, _ = find_checkpoint_dir(fs, path)
        return _megatron_damage(fs, megatron) if megatron else hf_damage(fs, path)
    except OSError as error:
        return f"{ref} cannot be read: {error}"


def hf_damage(fs: Any, path: str) -> str | None:
    index = f"{path}/{SAFETENSORS_INDEX}"
    if fs.isfile(index):
        try:
            weight_map = json.loads(fs.cat_file(index))["weight_map"]
            shards = sorted({str(file) for file in weight_map.values()})
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{index} is not an index of shards (a JSON object with a weight_map)"
        absent = [file for file in shards if not fs.isfile(f"{path}/{file}")]
        if absent:
            return f"{index} names {_some(absent)}, absent from {path}"
    for file in sorted(fs.glob(f"{path}/*.safetensors")):
        problem = _safetensors_damage(fs, file)
        if problem:
            return problem
    for file in sorted(fs.glob(f"{path}/pytorch_model*.bin")):
        problem = zip_damage(fs, file)
        if problem:
            return problem
    return None


def _safetensors_damage(fs: Any, file: str) -> str | None:
    """A safetensors file is 8 bytes (the header's length), a JSON header giving each tensor's byte range, and the
    data, which must end where the last range does: safetensors refuses any other size."""
    size = fs.size(file)
    header, length = _safetensors_header(fs, file)
    if length is None or length > HEADER_LIMIT:
        return f"{file} is not a safetensors file ({size} bytes, no header)"
    if 8 + length > size:
        return f"{file} is cut short: {size} bytes, less than its header alone ({8 + length})"
    try:
        ends = [int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{file} is not a safetensors file (its header is not one)"
    described = 8 + length + max(ends, default=0)
    if size < described:
        return f"{file} is cut short: {size} bytes where its header describes {described}"
    if size > described:
        return f"{file} has {size - described} bytes more than its header describes ({described})"
    return None


def safetensors_numel(file: Path) -> int | None:
    """The number of values in the tensors a safetensors file's header lists (None: no readable header)."""
    from fsspec.implementations.local import LocalFileSystem

    header, _ = _safetensors_header(LocalFileSystem(), str(file))
    try:
        return sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
    except (KeyError, TypeError, AttributeError):
        return None


def _safetensors_header(fs: Any, file: str) -> tuple[Any, int | None]:
    """(the parsed JSON header or None, its length in bytes or None when the file is too short to say)."""
    size = fs.size(file)
    with fs.open(file, "rb") as f:
        length = int.from_bytes(f.read(8), "little") if size >= 8 else None
        if length is None or length > HEADER_LIMIT or 8 + length > size:
            return None, length
        raw = f.read(length)
    try:
        return json.loads(raw), length
    except ValueError:
        return None, length


def zip_damage(fs: Any, file: str) -> str | None:
    """A torch.save file (a zip) cut short has lost its end record; an older pickle format is left alone."""
    size = fs.size(file)
    with fs.open(file, "rb") as f:
        if f.read(2) != b"PK":
            return None
        f.seek(max(0, size - 65_536 - 22))
        tail = f.read()
    return None if ZIP_END in tail else f"{file} is cut short: a zip file ({size} bytes) without its end"


def _megatron_damage(fs: Any, folder: str) -> str | None:
    """common.pt whole, and the torch_dist folder's items where its index places them."""
    common = f"{folder}/common.pt"
    if fs.isfile(common):
        problem = zip_damage(fs, common)
        if problem:
            return problem
    return dcp_damage(fs, folder)


def dcp_damage(fs: Any, folder: str, own: bool = False) -> str | None:
    """A torch.distributed.checkpoint folder: the index it writes last, and each *.distcp file it names at least as
    long as its items reach. own: the folder was written by this package, so an index this reader cannot read is
    damage (elsewhere a format it does not know is left for the checkpoint's own reader to judge)."""
    index = f"{folder}/{DCP_METADATA}"
    if not fs.isfile(index):
        return f"{folder} has no {DCP_METADATA}: its save did not finish"
    if fs.size(index) > DCP_METADATA_LIMIT:
        return None
    try:
        reach = _item_reach(fs, index)
    except (EOFError, pickle.UnpicklingError) as error:
        return f"{index} is cut short or broken ({error})"
    except Exception as error:  # noqa: BLE001 - an index this reader does not know
        return f"{index} cannot be read ({type(error).__name__})" if own else None
    for name, needed in sorted(reach.items()):
        file = f"{folder}/{name}"
        if not fs.isfile(file):
            return f"{file} is absent, and {folder}/{DCP_METADATA} places tensors in it"
        size = fs.size(file)
        if size < needed:
            return f"{file} is cut short: {size} bytes where {DCP_METADATA} places tensors up to byte {needed}"
    return None


def _item_reach(fs: Any, index: str) -> dict[str, int]:
    """file name -> the byte its items reach, from a DCP index."""
    with fs.open(index, "rb") as f:
        storage = _ItemsOnly(f).load().storage_data
    reach: dict[str, int] = {}
    for item in storage.values():
        reach[item.relative_path] = max(reach.get(item.relative_path, 0), int(item.offset) + int(item.length))
    return reach


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


class _Record:
    """Whatever class a torch_dist index names, standing in for it: its fields, no behaviour, nothing imported."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.args = args

    def __setstate__(self, state: Any) -> None:
        parts = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
        for part in parts:
            if isinstance(part, dict):
                self.__dict__.update(part)


class _ItemsOnly(pickle.Unpickler):
    """Reads torch.distributed.checkpoint's .metadata (a pickle) without torch: every class it names becomes a
    _Record, so reading it runs no code of the file's choosing."""

    SAFE = {("collections", "OrderedDict"): dict, ("builtins", "set"): set, ("builtins", "frozenset"): frozenset}

    def find_class(self, module: str, name: str) -> Any:
        return self.SAFE.get((module, name)) or type(name, (_Record,), {})
