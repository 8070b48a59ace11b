"""What NeMo-RL's DTensor worker and Megatron-Core say of a policy's shape at given parallel sizes, from their own
code, on a CPU:

    python tests/nemo_rl_shape_check.py MODEL_DIR DTENSOR_TP,MEGATRON_TP,MEGATRON_PP [...]

MODEL_DIR holds the policy's config.json. DTENSOR_TP: the model built from it (on the meta device) goes through
NeMo-RL's `_parallelize_model` (nemo_rl/models/dtensor/parallelize.py) with a tensor-parallel mesh of that size;
only the mesh is stood in (an object that answers size(), as a DeviceMesh of N ranks would: no N processes here),
and the run stops after NeMo-RL's shape assertions, before the mesh is used. MEGATRON_TP, MEGATRON_PP:
Megatron-Core's TransformerConfig of the same shape, and get_num_layers_to_build for the first pipeline stage.
Prints a JSON list, for each set of sizes {"dtensor": "ok" | "Error: ...", "megatron": ...}. Run it as a process of
its own.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import upstream  # noqa: E402


class _PastTheShapeChecks(Exception):
    """Raised by the mesh stand-in when NeMo-RL first uses the mesh beyond its size: its shape checks passed."""


class _TensorParallelMesh:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size

    def __getattr__(self, name: str):
        raise _PastTheShapeChecks(name)


def _said(call) -> str:
    try:
        call()
    except _PastTheShapeChecks:
        return "ok"
    except (AssertionError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "ok"


def dtensor(model_dir: Path, tp: int) -> str:
    sys.path.insert(0, str(upstream.nemo_rl_deps()))
    with contextlib.redirect_stdout(io.StringIO()), upstream.nemo_rl_importable(stub=frozenset({"vllm", "megatron"})):
        import torch
        from nemo_rl.models.dtensor.parallelize import _parallelize_model
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
        return _said(lambda: _parallelize_model(model, None, _TensorParallelMesh(tp), torch.float32))


def megatron(model_dir: Path, tp: int, pp: int) -> str:
    import torch
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

    hf = json.loads((model_dir / "config.json").read_text())

    def build() -> None:
        config = TransformerConfig(
            num_layers=hf["num_hidden_layers"],
            hidden_size=hf["hidden_size"],
            ffn_hidden_size=hf["intermediate_size"],
            num_attention_heads=hf["num_attention_heads"],
            num_query_groups=hf.get("num_key_value_heads"),
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            pipeline_dtype=torch.float32,
        )
        get_num_layers_to_build(config, pp_rank=0)

    return _said(build)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("sizes", nargs="+", help="DTENSOR_TP,MEGATRON_TP,MEGATRON_PP")
    args = parser.parse_args()
    said = []
    for sizes in args.sizes:
        dtensor_tp, megatron_tp, megatron_pp = map(int, sizes.split(","))
        said.append({"megatron": megatron(args.model_dir, megatron_tp, megatron_pp),
                     "dtensor": dtensor(args.model_dir, dtensor_tp)})  # fmt: skip
    print(json.dumps(said))
    return 0


if __name__ == "__main__":
    sys.exit(main())
