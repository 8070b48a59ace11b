"""vLLM's reload warnings on a weight update, run in the vLLM environment by test_vllm_rollouts.py.

    .venv-vllm/bin/python tests/vllm_reload_warnings_check.py POLICY_DIR   # prints one JSON object last

Two updates of the tiny policy (tied embeddings, rotary positions): the whole policy, whose reload gives the
rotary embedding and the tied output layer nothing by design; then the policy less one layer's weight, a reload
that really leaves a layer behind. vLLM's own handler prints its warnings on stdout as they come; the JSON
holds the reload warnings that reached the handlers, per update.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch

from rlsteps.engine.generation.vllm_backend import RELOAD_LOGGER
from rlsteps.engine.policy.model import load_policy
from vllm_backend_check import tiny_cpu_backend  # the script's folder is on sys.path

LEFT_OUT = "model.layers.0.mlp.down_proj.weight"  # a RowParallelLinear in vLLM's Llama


class Shown(logging.Handler):
    """The reload warnings that pass the logger's filters, as vLLM's handler gets them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class WithoutOneWeight:
    """The policy as whole_parameters reads it, less one parameter."""

    def __init__(self, model: torch.nn.Module, left_out: str) -> None:
        self.model, self.left_out = model, left_out

    def named_parameters(self):
        return [(name, p) for name, p in self.model.named_parameters() if name != self.left_out]


def main() -> None:
    torch.set_num_threads(1)
    policy = Path(sys.argv[1])
    model, tokenizer = load_policy(policy)
    backend = tiny_cpu_backend(policy, model, tokenizer)
    assert LEFT_OUT in dict(model.named_parameters())
    shown = Shown()
    logging.getLogger(RELOAD_LOGGER).addHandler(shown)
    report: dict = {"layers_without_weights": backend.layers_without_weights}
    for name, update in (("whole", model), ("one_left_out", WithoutOneWeight(model, LEFT_OUT))):
        print(f"=== update {name}", flush=True)
        shown.messages.clear()
        backend.load_weights(update)
        sys.stdout.flush()
        report[name] = [m for m in shown.messages if "Failed to load weights" in m]
    print("=== report", flush=True)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
