"""A checkpoint Megatron-Bridge's own save wrote, read by rlsteps: megatron-core 0.16.1's GPTModel (the check
`python -m rlsteps.engine.megatron.gpt_model` runs) and the engine's Hugging Face model take the very weights Bridge's
GPTModel held when it saved, and give the logits it gave.

tests/fixtures/megatron_bridge_checkpoint was written once by tests/make_bridge_checkpoint.py (its README says how):
Megatron-Bridge 0.6.2's AutoBridge.import_ckpt under Python 3.12, on megatron-core 0.19.2, whose torch_dist save
writes no common.pt (the common state is inside the checkpoint). Beside it, expected.safetensors holds the GPTModel's
tensors as Bridge saved them and its logits on a few tokens.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch

import required

required.importorskip("megatron.core", switch="MEGATRON")

from safetensors.torch import load_file  # noqa: E402

from rlsteps.engine.megatron.common_state import (  # noqa: E402
    COMMON_FILE,
    COMMON_STATE_KEY,
    load_in_this_process,
    read_common_state,
)
from rlsteps.engine.megatron.gpt_model import loaded_gpt_model, main, megatron_gpt  # noqa: E402
from rlsteps.engine.policy.model import load_policy  # noqa: E402
from test_megatron_format import MEGATRON_CORE_WARNINGS  # noqa: E402

pytestmark = [
    MEGATRON_CORE_WARNINGS,
    pytest.mark.filterwarnings("ignore:.*assuming the intent is to save in a single process:UserWarning"),  # a copy
]

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "megatron_bridge_checkpoint"
CHECKPOINT = FIXTURE / "checkpoint"
ITER_DIR = CHECKPOINT / "iter_0000000"


@pytest.fixture(scope="module")
def expected() -> dict[str, torch.Tensor]:
    return load_file(FIXTURE / "expected.safetensors")


def test_the_fixture_is_as_bridge_saves_it():
    """What makes it Bridge's and not ours: no common.pt, the common state inside the checkpoint, Bridge's whole
    ConfigContainer in run_config.yaml, its tokenizer assets, no hf_config/."""
    assert sorted(p.name for p in ITER_DIR.iterdir()) == [
        ".metadata", "__0_0.distcp", "metadata.json", "run_config.yaml", "tokenizer", "train_state.pt"
    ]  # fmt: skip
    assert not (ITER_DIR / COMMON_FILE).exists()
    assert read_common_state(ITER_DIR) == {
        "checkpoint_version": 3.0, "iteration": 0,
        "content_metadata": {"singleton_local_shards": False, "chained_optim_avoid_prefix": True},
    }  # fmt: skip
    run_config = (ITER_DIR / "run_config.yaml").read_text()
    assert "_target_: megatron.bridge.training.config.ConfigContainer" in run_config
    assert "_target_: megatron.bridge.models.gpt_provider.GPTModelProvider" in run_config


def test_gpt_model_reads_the_weights_bridge_saved_and_gives_its_logits(expected):
    """Every tensor GPTModel holds after its own dist_checkpointing.load is Bridge's, bit for bit, and its logits on
    the tokens Bridge's model ran are Bridge's."""
    saved = {name.removeprefix("model/"): t for name, t in expected.items() if name.startswith("model/")}
    with loaded_gpt_model(CHECKPOINT) as model:
        held = {name: t for name, t in model.state_dict().items() if not name.endswith("_extra_state")}
    assert sorted(held) == sorted(saved)
    for name, tensor in saved.items():
        assert held[name].dtype == tensor.dtype and torch.equal(held[name], tensor), name

    tokens, bridge_logits = expected["tokens"], expected["logits"]
    assert bridge_logits.abs().max() > 1.0  # logits of order one: the tolerances below mean something
    with megatron_gpt(CHECKPOINT) as gpt_logits:
        assert (gpt_logits(tokens) - bridge_logits).abs().max() < 1e-5


def test_the_engine_model_gives_bridge_logits(expected):
    """The Hugging Face model the engine loads from the checkpoint (its config from Bridge's run_config.yaml, token
    ids from the tokenizer Bridge saved) gives the logits Bridge's GPTModel gave."""
    model, tokenizer = load_policy(CHECKPOINT)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.pad_token_id == tokenizer.pad_token_id == 0 and model.config.eos_token_id == 1
    with torch.no_grad():
        logits = model(input_ids=expected["tokens"]).logits
    assert (logits - expected["logits"]).abs().max() < 1e-4
    assert torch.equal(logits.argmax(-1), expected["logits"].argmax(-1))


def test_the_gpt_model_command_checks_a_checkpoint_bridge_saved(capsys):
    main([str(CHECKPOINT), "--device", "cpu"])
    report = json.loads(capsys.readouterr().out)
    assert report["max_abs_diff"] < 1e-4 and report["same_argmax"] == 1.0 and report["logit_scale"] > 1.0


def without_common_state(folder: Path) -> Path:
    """A copy of the fixture whose torch_dist files hold every item of Bridge's but the common state, as a save cut
    short before it would leave them."""
    from torch.distributed.checkpoint import BytesStorageMetadata, FileSystemReader, FileSystemWriter, save

    shutil.copytree(CHECKPOINT, folder)
    iter_dir = folder / ITER_DIR.name
    stored = FileSystemReader(str(ITER_DIR)).read_metadata().state_dict_metadata
    items = {key: io.BytesIO() if isinstance(item, BytesStorageMetadata) else torch.empty(item.size)
             for key, item in stored.items() if key != COMMON_STATE_KEY}  # fmt: skip
    load_in_this_process(items, ITER_DIR)
    for stale in (".metadata", "__0_0.distcp"):
        (iter_dir / stale).unlink()
    save(items, storage_writer=FileSystemWriter(str(iter_dir)), no_dist=True)
    return folder


def test_a_checkpoint_without_its_common_state_is_refused_in_one_line(tmp_path, capsys):
    """Neither common.pt nor the object inside: the command says so (exit 3), not megatron-core's error."""
    broken = without_common_state(tmp_path / "broken")
    with pytest.raises(SystemExit) as exit_info:
        main([str(broken), "--device", "cpu"])
    assert exit_info.value.code == 3
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        f"python -m rlsteps.engine.megatron.gpt_model: {broken / ITER_DIR.name} has neither common.pt (megatron-core "
        f"0.16 and older) nor the {COMMON_STATE_KEY} object later releases keep inside the checkpoint: its save did "
        "not finish, or another program wrote it"
    ]
