"""Prompts from Hugging Face datasets beside JSONL: a dataset saved to disk (Dataset and DatasetDict), parquet and
arrow files, and a Hub dataset id through the cache, read through the datasets library with a column map
(data.prompt_column) and a split (data.split, data.val_split); the other columns are the prompt's fields. Checked by
the dry run like a JSONL file (counts, lengths, the first bad row named by its split and index), without torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import datasets  # the data extra: the test extra installs it
import pytest

from cli_helpers import dry_run_in_fresh_python
from rlsteps.artifacts.inputs import ResolvedInput, check_input
from rlsteps.catalog import load_catalog
from rlsteps.contract.prompts import PromptFileError, PromptOptions, load_prompts, prompt_options
from rlsteps.plan.prompt_check import Measure, checked_prompt_files
from rlsteps.tiny.layout import load_tiny_world
from run_helpers import FAST, rlsteps
from test_data import word_tokenizer
from test_hub_ids import fill_hub_cache

ROWS = {"question": ["a b", "hello", "c"], "answer": ["1", "2", "3"]}
RENDERED = ["[user] a b\n[assistant] ", "[user] hello\n[assistant] ", "[user] c\n[assistant] "]


def sources(folder: Path) -> dict[str, Path]:
    """The same three rows as each kind of dataset the run reads."""
    rows = datasets.Dataset.from_dict(ROWS)
    rows.save_to_disk(folder / "saved")
    other = datasets.Dataset.from_dict({"question": ["c"], "answer": ["9"]})
    datasets.DatasetDict({"train": rows, "test": other}).save_to_disk(folder / "saved_dict")
    rows.to_parquet(folder / "rows.parquet")
    [arrow] = (folder / "saved").glob("*.arrow")
    (folder / "hub" / "data").mkdir(parents=True)
    rows.to_parquet(folder / "hub" / "data" / "train-00000-of-00001.parquet")
    other.to_parquet(folder / "hub" / "data" / "test-00000-of-00001.parquet")
    return {"saved": folder / "saved", "saved_dict": folder / "saved_dict", "parquet": folder / "rows.parquet",
            "arrow": arrow, "hub_files": folder / "hub"}  # fmt: skip


@pytest.mark.parametrize("kind", ["saved", "saved_dict", "parquet", "arrow", "hub_files"])
def test_each_kind_of_dataset_reads_as_prompts_with_its_other_columns_as_fields(kind, tmp_path):
    path = str(sources(tmp_path)[kind])
    assert [t.name for t in load_catalog().types.values() if t.detect == "hf_dataset"] == ["prompt_dataset"]
    item = check_input(load_catalog(), "prompts", "inputs.prompts", path, "prompts")
    assert item.status == "ok" and item.detected == ["prompt_dataset"]
    prompts = load_prompts(path, word_tokenizer(), options=PromptOptions(prompt_column="question"))
    assert [p.text for p in prompts] == RENDERED  # a text column is the user's message, rendered with the template
    assert [p.fields for p in prompts] == [{"answer": a} for a in ROWS["answer"]]
    assert prompts[0].messages == (("user", "a b"),) and len({p.id for p in prompts}) == 3


def test_a_hub_dataset_id_reads_its_cached_snapshot_offline(tmp_path, monkeypatch):
    home = tmp_path / "hf_home"
    snapshot = fill_hub_cache(home, "tiny-org/prompts", sources(tmp_path)["hub_files"], repo_type="dataset")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    item = check_input(load_catalog(), "prompts", "inputs.prompts", "tiny-org/prompts", "prompts", hub_id=True)
    assert (item.status, item.path, item.detected) == ("ok", str(snapshot), ["prompt_dataset"])
    [checked] = checked_prompt_files([item], Measure(None, None, frozenset(), {"prompt_column": "question"}))
    assert checked.status == "ok"
    [broken] = checked_prompt_files([item], Measure(None, None, frozenset(), {"prompt_column": "nope"}))
    assert (
        broken.status == "malformed" and "(split train) row 0: no column 'nope' (data.prompt_column)" in broken.problem
    )


def test_the_column_holds_messages_or_text_and_prompt_stays_verbatim(tmp_path):
    messages = [
        [{"role": "user", "content": "a"}],
        [{"role": "system", "content": "b"}, {"role": "user", "content": "c"}],
    ]
    rows = datasets.Dataset.from_dict({"chat": messages, "prompt": ["raw a", "raw b"], "id": ["x", "y"]})
    rows.to_parquet(tmp_path / "rows.parquet")
    path = str(tmp_path / "rows.parquet")
    chats = load_prompts(path, word_tokenizer(), options=PromptOptions(prompt_column="chat"))
    assert [p.text for p in chats] == ["[user] a\n[assistant] ", "[system] b\n[user] c\n[assistant] "]
    assert [p.id for p in chats] == ["x", "y"] and chats[0].fields == {}  # the prompt column is not a field
    raw = load_prompts(path, word_tokenizer(), options=PromptOptions(prompt_column="prompt"))
    assert [p.text for p in raw] == ["raw a", "raw b"] and raw[0].fields == {"chat": messages[0]}


def test_the_first_bad_row_is_named_by_its_split_and_index(tmp_path):
    rows = datasets.Dataset.from_dict({"question": ["a", "b", ""], "answer": ["1", "2", "3"]})
    longer = datasets.Dataset.from_dict({"question": ["a", "a b c"], "answer": ["1", "2"]})
    datasets.DatasetDict({"train": rows, "test": longer}).save_to_disk(tmp_path / "d")
    with pytest.raises(PromptFileError, match=r"d \(split train\) row 2: the prompt is empty") as raised:
        load_prompts(str(tmp_path / "d"), None, options=PromptOptions(prompt_column="question"))
    assert "data.prompt_column" in raised.value.fix
    options = PromptOptions(prompt_column="question", splits=("test",))
    assert len(load_prompts(str(tmp_path / "d"), word_tokenizer(), max_prompt_tokens=9, options=options)) == 2
    with pytest.raises(PromptFileError, match=r"d \(split test\) row 1: the prompt has 9 tokens, more than "):
        load_prompts(str(tmp_path / "d"), word_tokenizer(), max_prompt_tokens=8, options=options)
    with pytest.raises(PromptFileError, match=r"row 0: a line needs exactly one of \"prompt\" or \"messages\""):
        load_prompts(str(tmp_path / "d"), None)  # no column named: a JSONL line's keys, which these rows lack


def test_the_split_is_data_split_or_for_validation_validation_then_test(tmp_path):
    splits = {name: datasets.Dataset.from_dict({"prompt": [name]}) for name in ("train", "validation", "test")}
    datasets.DatasetDict(splits).save_to_disk(tmp_path / "three")
    datasets.DatasetDict({"train": splits["train"], "test": splits["test"]}).save_to_disk(tmp_path / "two")

    def read(name: str, data: dict, source: str = "three") -> list[str]:
        return [p.text for p in load_prompts(str(tmp_path / source), None, options=prompt_options(data, name))]

    assert read("prompts", {}) == ["train"] and read("val_prompts", {}) == ["validation"]
    assert read("val_prompts", {}, "two") == ["test"] and read("prompts", {"split": "test"}) == ["test"]
    assert read("val_prompts", {"val_split": "train"}) == ["train"]
    with pytest.raises(PromptFileError, match=r"no split 'dev'; its splits are train, validation, test") as raised:
        read("prompts", {"split": "dev"})
    assert raised.value.fix == "pass data.split=ONE_OF_THOSE"


def test_without_the_datasets_package_a_dataset_is_refused_with_the_install_line(tmp_path, monkeypatch):
    path = str(sources(tmp_path)["parquet"])
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    with pytest.raises(PromptFileError, match="datasets package, which is not installed here") as raised:
        load_prompts(path, None)
    assert raised.value.fix == "pip install 'rlsteps[data]'"


def test_nemo_rl_s_job_refuses_a_dataset_it_cannot_read(tmp_path):
    path = str(sources(tmp_path)["parquet"])
    item = ResolvedInput("prompts", "inputs.prompts", path, "prompts", ["prompt_dataset"], "ok")
    [checked] = checked_prompt_files([item], Measure(None, None, frozenset(), {}, engine="nemo_rl"))
    assert checked.status == "malformed" and "NeMo-RL's job reads JSONL" in checked.problem
    assert "Dataset.to_json" in checked.fix


def test_nemo_rl_s_compile_refuses_a_dataset_named_as_one():
    from rlsteps.nemo_rl.master_config import NemoRlConfigError
    from test_nemo_rl_config import RLHF_INPUTS, master

    for ref in ("tiny-org/prompts", "/lustre/prompts.parquet"):
        with pytest.raises(NemoRlConfigError, match=f"inputs.prompts={ref} is a Hugging Face dataset"):
            master("rl/rlhf", *RLHF_INPUTS, f"inputs.prompts={ref}")


def tiny_prompts_as_parquet(folder: Path, long_row: int | None = None) -> Path:
    """The tiny world's training prompts as a parquet file of a "question" column (one made too long)."""
    world = load_tiny_world(0)
    lines = [json.loads(line) for line in world.train_prompts.read_text().splitlines()]
    questions = [line["messages"][0]["content"] for line in lines]
    if long_row is not None:
        questions[long_row] = "Describe the castle. " * 40
    path = folder / "prompts.parquet"
    datasets.Dataset.from_dict({"question": questions, "id": [line["id"] for line in lines]}).to_parquet(path)
    return path


def test_the_dry_run_reads_and_measures_a_dataset_without_torch(tmp_path, tiny_world):
    dry_run = dry_run_in_fresh_python
    good = tiny_prompts_as_parquet(tmp_path)
    both = (f"inputs.val_prompts={good}", "data.prompt_column=question")  # the column of every prompt input
    done = dry_run(f"inputs.prompts={good}", *both)
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout + done.stderr
    (tmp_path / "long").mkdir()
    long = tiny_prompts_as_parquet(tmp_path / "long", long_row=5)
    refused = dry_run(f"inputs.prompts={long}", *both)
    assert refused.stdout.strip().splitlines()[-1] == "3 []", refused.stdout + refused.stderr
    assert f"input 'prompts': {long} (split train) row 5: the prompt has " in refused.stderr
    unnamed = dry_run(f"inputs.prompts={good}")  # no data.prompt_column: "question" is no prompt key
    assert "row 0: a line needs exactly one of" in unnamed.stderr and "data.prompt_column=COLUMN" in unnamed.stderr


@pytest.mark.slow
def test_a_run_trains_on_a_parquet_dataset_with_its_ids(tmp_path, tiny_world):
    path = tiny_prompts_as_parquet(tmp_path)
    out = tmp_path / "run"
    short = ["train.max_steps=1", "validation.interval=0", "rollout.prompts_per_step=4", "train.global_batch_size=32"]
    given = [f"inputs.prompts={path}", "inputs.val_prompts=null", "data.prompt_column=question"]
    given += ["output.type=checkpoint_hf"]
    done = rlsteps("run", "rl/reinforce", "-c", "tiny", *given, *short, f"output.dir={out}", *FAST, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert ": 256 prompts at" in done.stderr  # the start line: every row of the dataset read
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["prompt_id"].startswith("tiny-train-") for s in samples), samples[0]
    assert samples[0]["prompt"][0]["role"] == "user"  # the question column, as the user's message
