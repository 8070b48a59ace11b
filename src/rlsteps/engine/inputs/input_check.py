"""What an unusable input says, and the check a job makes of the inputs only its cluster can see.

The submitting machine checks every input it can see (rlsteps.artifacts.inputs). An input on a path the
profile declares as the cluster's (a Lepton mount, a Slurm `cluster_paths` entry) cannot be checked there:
the job checks it itself, before it starts a server or loads a policy, with the same messages and exit 3.
What it needs travels in job.yaml as `inputs_in_job`, one InputInJob each; the job needs no catalog.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from fsspec.core import url_to_fs

from rlsteps.engine.inputs.detect import detect, exists
from rlsteps.engine.megatron import find_checkpoint_dir

EXIT_INPUT = 3  # as rlsteps.errors.ArtifactError: a missing, malformed or mistyped input artifact
PROMPT_FILE_FIX = 'each line must be {"prompt": "..."} or {"messages": [{"role", "content"}, ...]}'


class InputProblem(Exception):
    """An input the job cannot use: what is wrong, and the fix."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} (fix: {self.fix})" if self.fix else self.message


def missing(name: str, key: str, ref: str, wanted: str) -> InputProblem:
    return InputProblem(f"input '{name}': {ref} does not exist", fix=f"pass {key}=PATH to a {wanted}")


def wrong_type(name: str, ref: str, detected: Iterable[str], wanted: str) -> str:
    what = " or ".join(detected) or "not a recognised artifact"
    return f"input '{name}': {ref} is {what}, but a {wanted} is required"


@dataclass(frozen=True)
class InputInJob:
    """One input the job checks itself, with all the catalog knows that the check needs."""

    name: str
    key: str
    ref: str
    required_type: str
    wanted: str  # the required type as messages name it, e.g. "policy (checkpoint_hf or checkpoint_megatron)"
    accepted: list[str]  # every type that is a required_type
    detectors: dict[str, str | None] = field(default_factory=dict)  # every known type -> its detector

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check(self) -> None:
        """Raise InputProblem when the input is absent or of no accepted type; parse a prompt file whole."""
        if not exists(self.ref):
            raise missing(self.name, self.key, self.ref, self.wanted)
        detected = detect(self.ref, self.detectors)
        if not set(detected) & set(self.accepted):
            raise InputProblem(
                wrong_type(self.name, self.ref, detected, self.wanted), fix=f"point {self.key} at a {self.wanted}"
            )
        problem = (
            prompt_file_problem(self.name, self.ref)
            if self.required_type == "prompt_jsonl"
            else damaged_weights(self.name, self.key, self.ref)
        )
        if problem is not None:
            raise problem


def prompt_file_problem(name: str, ref: str) -> InputProblem | None:
    """Every line of a prompt file parsed (without the policy's tokenizer): the first bad one, or None."""
    from rlsteps.engine.inputs.data import PromptFileError, check_prompt_file  # torch-free

    try:
        check_prompt_file(ref)
    except PromptFileError as error:
        return InputProblem(f"input '{name}': {error}", fix=error.fix or PROMPT_FILE_FIX)
    return None


def damaged_weights(name: str, key: str, ref: str) -> InputProblem | None:
    """A model folder whose weight files are cut short or broken, found from their headers and sizes without
    reading a weight; None when nothing is wrong that way."""
    damage = weight_damage(ref)
    if damage is None:
        return None
    return InputProblem(
        f"input '{name}': {damage}",
        fix=f"copy or download it again (a copy or a save cut short leaves such files), or point {key} at a whole one",
    )


def check_inputs_in_job(records: Iterable[dict[str, Any]]) -> list[InputInJob]:
    """Check every input job.yaml lists under inputs_in_job; raise InputProblem for the first unusable one."""
    inputs = [InputInJob(**record) for record in records]
    for item in inputs:
        item.check()
    return inputs


# ---------------------------------------------------------------------------------------------
# Weight files: cut short or broken, told from their headers and sizes alone

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
        return _megatron_damage(fs, megatron) if megatron else _hf_damage(fs, path)
    except OSError as error:
        return f"{ref} cannot be read: {error}"


def _hf_damage(fs: Any, path: str) -> str | None:
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
        problem = _zip_damage(fs, file)
        if problem:
            return problem
    return None


def _safetensors_damage(fs: Any, file: str) -> str | None:
    """A safetensors file is 8 bytes (the header's length), a JSON header giving each tensor's byte range, and the
    data, which must end where the last range does: safetensors refuses any other size."""
    size = fs.size(file)
    with fs.open(file, "rb") as f:
        length = int.from_bytes(f.read(8), "little") if size >= 8 else None
        if length is None or length > HEADER_LIMIT:
            return f"{file} is not a safetensors file ({size} bytes, no header)"
        if 8 + length > size:
            return f"{file} is cut short: {size} bytes, less than its header alone ({8 + length})"
        raw = f.read(length)
    try:
        header = json.loads(raw)
        ends = [int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{file} is not a safetensors file (its header is not one)"
    described = 8 + length + max(ends, default=0)
    if size < described:
        return f"{file} is cut short: {size} bytes where its header describes {described}"
    if size > described:
        return f"{file} has {size - described} bytes more than its header describes ({described})"
    return None


def _zip_damage(fs: Any, file: str) -> str | None:
    """A torch.save file (a zip) cut short has lost its end record; an older pickle format is left alone."""
    size = fs.size(file)
    with fs.open(file, "rb") as f:
        if f.read(2) != b"PK":
            return None
        f.seek(max(0, size - 65_536 - 22))
        tail = f.read()
    return None if ZIP_END in tail else f"{file} is cut short: a zip file ({size} bytes) without its end"


def _megatron_damage(fs: Any, folder: str) -> str | None:
    """The index torch_dist writes last, each *.distcp file it names at least as long as its items reach, and
    common.pt whole."""
    common = f"{folder}/common.pt"
    if fs.isfile(common):
        problem = _zip_damage(fs, common)
        if problem:
            return problem
    index = f"{folder}/{DCP_METADATA}"
    if not fs.isfile(index):
        return f"{folder} has no {DCP_METADATA}: its save did not finish"
    if fs.size(index) > DCP_METADATA_LIMIT:
        return None
    try:
        with fs.open(index, "rb") as f:
            storage = _ItemsOnly(f).load().storage_data
        reach: dict[str, int] = {}
        for item in storage.values():
            reach[item.relative_path] = max(reach.get(item.relative_path, 0), int(item.offset) + int(item.length))
    except (EOFError, pickle.UnpicklingError) as error:
        return f"{folder}/{DCP_METADATA} is cut short or broken ({error})"
    except Exception:  # an index this reader does not know: the checkpoint's own reader judges it
        return None
    for name, needed in sorted(reach.items()):
        file = f"{folder}/{name}"
        if not fs.isfile(file):
            return f"{file} is absent, and {folder}/{DCP_METADATA} places tensors in it"
        size = fs.size(file)
        if size < needed:
            return f"{file} is cut short: {size} bytes where {DCP_METADATA} places tensors up to byte {needed}"
    return None


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
