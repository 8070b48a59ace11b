"""Megatron-Bridge's own code as the judge of checkpoint_megatron: its config container, loaders and serialiser.

tests/fetch_megatron_bridge.sh downloads the pinned wheels (Megatron-Bridge 0.6.2 and the megatron-core 0.19.2 whose
megatron.training holds the ConfigContainer base it builds on) once, in CI's install phase; they are unpacked here and
imported by tests/megatron_bridge_oracle.py in a process of its own. Nothing is downloaded at test time: without the
wheels a test skips with the command that fetches them, and fails instead under RLSTEPS_REQUIRE_MEGATRON=1.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from upstream import _cache, _unavailable, built_once

BRIDGE_VERSION = "0.6.2"
WHEELS = {
    "megatron_bridge": "megatron_bridge-0.6.2-py3-none-any.whl",
    "megatron_core": "megatron_core-0.19.2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
}
ORACLE = Path(__file__).resolve().parent / "megatron_bridge_oracle.py"
FETCH = "bash tests/fetch_megatron_bridge.sh"


def wheel_dir() -> Path:
    return Path(os.environ.get("RLSTEPS_MEGATRON_BRIDGE_DIR") or _cache() / f"megatron-bridge-{BRIDGE_VERSION}")


def unpacked() -> list[Path]:
    """The unpacked wheels (Bridge's first), each a folder holding its `megatron/` namespace package."""
    roots = []
    for name, wheel_name in WHEELS.items():
        wheel = wheel_dir() / wheel_name
        if not wheel.is_file():
            missing = f"{wheel} is missing: the pinned Megatron-Bridge that judges checkpoint_megatron ({FETCH})"
            _unavailable(missing, switch="MEGATRON")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:12]
        roots.append(built_once(_cache() / f"{name}-{digest}", _extractor(wheel)))
    return roots


def _extractor(wheel: Path):
    def extract(staging: Path) -> Path:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(staging)
        return staging

    return extract


def bridge(command: str, *args: str | os.PathLike) -> dict:
    """Run one oracle command (see megatron_bridge_oracle.py) under Bridge's code; its JSON answer."""
    env = dict(os.environ, RLSTEPS_MEGATRON_BRIDGE_ROOTS=os.pathsep.join(map(str, unpacked())))
    env.setdefault("OMP_NUM_THREADS", "1")
    done = subprocess.run(
        [sys.executable, str(ORACLE), command, *map(str, args)], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Megatron-Bridge oracle failed (exit {done.returncode}):\n{done.stderr[-8000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bridge_batch(*calls: tuple) -> list[dict]:
    """Several oracle commands in one process (Bridge's import is most of the time): one {"ok": answer} or
    {"error": message} each."""
    return bridge("batch", json.dumps([[str(part) for part in call] for call in calls]))


# ---------------------------------------------------------------------------------------------
# Helpers the tests that judge with Bridge share

# Fields Bridge's provider holds that the checkpoint does not decide: where Bridge read the HF model from.
NOT_FROM_THE_CHECKPOINT = frozenset({"hf_model_id"})
EXPORT_TOKENS = [[5, 17, 42, 99, 3, 250, 7, 64], [120, 8, 8, 301, 11, 2, 77, 180]]


def provider_differences(provider: dict, loaded: dict) -> dict[str, dict]:
    """For each of Bridge's loaders (NeMo-RL's from_yaml(STRICT), export_ckpt's load_model_config): the fields where
    the provider it built from the checkpoint differs from the one Bridge builds from the HF config, as
    {field: (from the checkpoint, Bridge's import)}; the fields of NOT_FROM_THE_CHECKPOINT left out."""
    assert "ok" in loaded, f"Megatron-Bridge refuses the checkpoint: {loaded.get('error')}"
    assert "ok" in provider, provider.get("error")
    out = {}
    for how in ("strict", "load_model_config"):
        built = loaded["ok"][how]
        differ = {k: (built.get(k), v) for k, v in provider["ok"].items() if built.get(k) != v}
        out[how] = {k: pair for k, pair in differ.items() if k not in NOT_FROM_THE_CHECKPOINT}
    return out


def config_only(hf_dir: Path, folder: Path) -> Path:
    """The HF folder's config.json alone: Bridge's export takes the config from it and every weight from the
    checkpoint (from_hf_config reads no weights; here there are none to read)."""
    folder.mkdir(parents=True)
    shutil.copy(hf_dir / "config.json", folder)
    return folder


def safetensors_of(folder: Path) -> dict:
    """Every tensor of the *.safetensors files in `folder`, by name."""
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def assert_exported_as_it_came(hf_dir: Path, answer: dict, name: str) -> dict:
    """Bridge's export_cpu answer for a checkpoint written from `hf_dir`: every tensor of the original HF folder,
    bit for bit (a tied output layer also as lm_head.weight, equal to the embedding), with a config from which
    transformers builds a model of the same logits on EXPORT_TOKENS; the GPTModel Bridge loaded computes them too.
    Returns the answer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    assert "ok" in answer, f"Megatron-Bridge's export of {name} failed: {answer.get('error')}"
    answer = answer["ok"]
    assert answer["model_class"][-1] == "megatron.core.models.gpt.gpt_model.GPTModel"  # (bf16: in Float16Module)
    assert answer["cpu_build"]["transformer_layer_spec"][0] == "megatron.bridge.models.gpt_provider.default_layer_spec"
    exported_dir = Path(answer["exported"])
    original, exported = safetensors_of(hf_dir), safetensors_of(exported_dir)
    hf = AutoConfig.from_pretrained(hf_dir)
    extra = set(exported) - set(original)
    assert set(original) <= set(exported) and extra <= ({"lm_head.weight"} if hf.tie_word_embeddings else set())
    for key, tensor in original.items():
        assert exported[key].dtype == tensor.dtype and torch.equal(exported[key], tensor), key
    if extra:
        assert torch.equal(exported["lm_head.weight"], original["model.embed_tokens.weight"])

    def logits(model_dir: Path, dtype) -> torch.Tensor:
        with torch.no_grad():
            return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)(torch.tensor(EXPORT_TOKENS)).logits

    expected = logits(hf_dir, "auto")
    assert torch.equal(logits(exported_dir, "auto"), expected)
    exact = logits(hf_dir, torch.float32)  # bf16 upcast
    megatron = torch.load(answer["logits"])
    assert megatron.shape == exact.shape
    if hf.dtype == torch.float32:
        assert (megatron - exact).abs().max() < 1e-4
        assert torch.equal(megatron.argmax(-1), exact.argmax(-1))
    else:  # bf16 arithmetic: off the exact logits by no more than twice as much as transformers' own bf16 pass
        assert (megatron - exact).abs().max() <= 2 * (expected.float() - exact).abs().max()
    return answer
