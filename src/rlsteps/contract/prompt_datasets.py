"""Prompts from Hugging Face datasets, read row by row through the `datasets` library (the `data` extra), torch-free.

A prompt dataset is any of:
- a folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk` (read in place, memory-mapped);
- a `.parquet` or `.arrow` file (one split);
- a folder of parquet or arrow files, such as a Hub dataset's snapshot (rlsteps.contract.hub): its splits are named
  by its files as the Hub names them (`data/train-00000-of-00001.parquet`, `test.parquet`, ...).
Files are streamed: nothing is copied into the datasets cache. A source of one split is read whole; of several, the
split the run's data.split (training) or data.val_split (validation) names. Each row is a mapping that
rlsteps.contract.prompts turns into a prompt as it does a JSONL line (data.prompt_column names the prompt's column).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import Any

from fsspec.core import url_to_fs

DATA_EXTRA = "pip install 'rlsteps[data]'"
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # DatasetDict.save_to_disk, Dataset.save_to_disk
DATA_SUFFIXES = (".parquet", ".arrow")
SEARCH_DEPTH = 3  # a Hub dataset keeps its files at most a couple of folders down (data/, a config's folder)


def is_prompt_dataset(ref: str) -> bool:
    """A parquet or arrow file, a folder saved by the datasets library, or a folder holding parquet or arrow files."""
    fs, path = url_to_fs(ref)
    if fs.isfile(path):
        return path.lower().endswith(DATA_SUFFIXES)
    if not fs.isdir(path):
        return False
    root = path.rstrip("/")
    return any(fs.isfile(f"{root}/{marker}") for marker in SAVED_MARKERS) or bool(_data_files(fs, root))


def _data_files(fs: Any, root: str) -> list[str]:
    found: list[str] = []
    for depth in range(SEARCH_DEPTH):
        for suffix in DATA_SUFFIXES:
            found += fs.glob(f"{root}/{'*/' * depth}*{suffix}")
    return found


def dataset_rows(
    path: str, splits: tuple[str, ...], split_key: str, read: Callable[[int, int], None]
) -> Iterator[tuple[str, str, str, Any]]:
    """Every row of the dataset's chosen split: (how a message names it, how another row's names it, its default id,
    the row as a mapping). PromptFileError when the dataset cannot be read, has no such split, or no rows."""
    from rlsteps.contract.prompt_errors import PromptFileError

    datasets = _datasets(path)
    source = _opened(datasets, path)
    name, chosen = _split(path, source, splits, split_key)
    where = path if name is None else f"{path} (split {name})"
    stem = PurePosixPath(path.rstrip("/")).stem
    index = -1
    for index, row in enumerate(_guarded(path, chosen)):
        read(0, index + 1)
        yield f"{where} row {index}", f"row {index}", f"{stem}:{name or 'rows'}:{index}", row
    if index < 0:
        raise PromptFileError(f"{where}: the dataset has no rows", fix="point the input at a dataset with prompts")


def _datasets(path: str) -> Any:
    from rlsteps.contract.prompt_errors import PromptFileError

    try:
        import datasets
    except ImportError:
        raise PromptFileError(
            f"{path}: a Hugging Face dataset is read with the datasets package, which is not installed here",
            fix=DATA_EXTRA,
        ) from None
    datasets.disable_progress_bars()
    if "torch" not in sys.modules:  # a streamed dataset imports torch where it is installed, for a DataLoader's shared
        datasets.config.TORCH_AVAILABLE = False  # epoch; prompts are read without one, and a dry run imports no torch
    return datasets


def _opened(datasets: Any, path: str) -> Any:
    """The dataset as the datasets library opens it: a Dataset(Dict) saved to disk, else its files, streamed."""
    fs, local = url_to_fs(path)
    root = local.rstrip("/")
    try:
        if fs.isdir(local) and any(fs.isfile(f"{root}/{marker}") for marker in SAVED_MARKERS):
            return datasets.load_from_disk(path)
        if fs.isfile(local):
            builder = "parquet" if local.lower().endswith(".parquet") else "arrow"
            return datasets.load_dataset(builder, data_files=path, streaming=True)
        return datasets.load_dataset(path, streaming=True)
    except Exception as error:  # noqa: BLE001 - pyarrow's and the datasets library's own errors
        raise _unreadable(path, error) from None


def _guarded(path: str, rows: Any) -> Iterator[Any]:
    """The rows, an error of the reader (a damaged file met halfway) said as the dataset's."""
    iterator = iter(rows)
    while True:
        try:
            row = next(iterator)
        except StopIteration:
            return
        except Exception as error:  # noqa: BLE001 - pyarrow's and the datasets library's own errors
            raise _unreadable(path, error) from None
        yield dict(row)


def _unreadable(path: str, error: Exception) -> Exception:
    from rlsteps.contract.prompt_errors import PromptFileError

    said = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return PromptFileError(
        f"{path}: cannot be read as a Hugging Face dataset: {type(error).__name__}: {said}",
        fix="check the files (Dataset.save_to_disk's folder, parquet or arrow), or write the prompts as JSONL",
    )


def _split(path: str, source: Any, splits: tuple[str, ...], split_key: str) -> tuple[str | None, Any]:
    """(the split's name, its rows): a source of one split is read whole; of several, the first of splits it has."""
    from rlsteps.contract.prompt_errors import PromptFileError

    if not hasattr(source, "keys"):  # a Dataset, not a dict of splits
        return None, source
    names = list(source.keys())
    if len(names) == 1:
        return names[0], source[names[0]]
    for name in splits:
        if name in names:
            return name, source[name]
    raise PromptFileError(
        f"{path}: the dataset has no split {' or '.join(map(repr, splits))}; its splits are {', '.join(names)}",
        fix=f"pass {split_key}=ONE_OF_THOSE",
    )
