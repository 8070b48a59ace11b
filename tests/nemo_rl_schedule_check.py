"""The learning rates NeMo-RL's own code gives a compiled schedule, at every optimizer step (run in a process of its
own: the stand-ins of tests/upstream.py stay in sys.modules).

    python nemo_rl_schedule_check.py < CASES.json > RATES.json

CASES: a list of {"policy": <policy section of a master config>, "grpo_steps": N, "per_step": B}. For each case the
policy's optimizer and scheduler are built by NeMo-RL's DTensor (v2) policy worker setup,
nemo_rl.models.automodel.setup.setup_model_and_optimizer, with the real torch, on a one-parameter model; then
NeMo-RL's training loop is followed (DTensorPolicyWorkerV2.train: B optimizer steps per train() call, the scheduler
stepped once after them) for N GRPO steps. Out: per case, the lr of each optimizer step, or {"error": ...} when
NeMo-RL's setup refuses the config.
"""

import contextlib
import importlib
import json
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import upstream  # noqa: E402


def locate_class(path: str) -> type:
    """hydra.utils.get_class (hydra is not installed here): the class at a dotted path."""
    module, _, name = path.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    if not isinstance(found, type):
        raise ValueError(f"{path} is not a class")
    return found


class OneParameter:
    """What the model class's from_pretrained gives setup_model_and_optimizer: a module with one parameter."""

    @staticmethod
    def from_pretrained(*_args, **_kwargs):
        import torch

        model = torch.nn.Linear(1, 1, bias=False)
        model.config = SimpleNamespace(pad_token_id=0, tie_word_embeddings=False)
        return model


def pin_automodel() -> None:
    """NeMo-Automodel's stand-in without NeMoAutoModelForTokenClassification, as the Automodel that NeMo-RL v0.7.0
    pins (setup.py backports it then, and refuses to import when Automodel already has it)."""
    import nemo_automodel

    served = type(nemo_automodel)

    class PinnedAutomodel(served):
        def __getattr__(self, name: str):
            if name == "NeMoAutoModelForTokenClassification":
                raise AttributeError(name)
            return served.__getattr__(self, name)

    nemo_automodel.__class__ = PinnedAutomodel
    sys.modules["nemo_automodel.NeMoAutoModelForTokenClassification"] = None  # nor as a submodule


def rates(setup, policy: dict, grpo_steps: int, per_step: int) -> list[float]:
    import torch

    runtime = SimpleNamespace(
        model_class=OneParameter,
        model_config=SimpleNamespace(architectures=["OneParameter"], model_type="one", torch_dtype=torch.float32),
        hf_config_overrides={},
        attn_impl=None,
        cpu_offload=False,
        is_reward_model=False,
        enable_seq_packing=False,
    )
    context = SimpleNamespace(
        device_mesh=None,
        moe_mesh=None,
        fsdp2_config=SimpleNamespace(sequence_parallel=False),
        moe_config=None,
        dp_size=1,
        tp_size=1,
        cp_size=1,
    )
    state = setup.setup_model_and_optimizer(
        policy, SimpleNamespace(pad_token_id=0), runtime, context, checkpoint_manager=None
    )
    optimizer, scheduler = state.optimizer, state.scheduler
    seen = []
    for _ in range(grpo_steps):  # DTensorPolicyWorkerV2.train, once per GRPO step
        for _ in range(per_step):
            seen.append(optimizer.param_groups[0]["lr"])
            optimizer.zero_grad()
            optimizer.step()
        scheduler.step()
    return seen


def main() -> int:
    cases = json.load(sys.stdin)
    with (
        contextlib.redirect_stdout(sys.stderr),
        upstream.nemo_rl_importable(stub=(upstream.HEAVY - {"torch"}) | {"nemo_automodel"}),
    ):
        import torch
        import torch.distributed as dist

        pin_automodel()
        from nemo_rl.models.automodel import setup

        setup.get_class = locate_class  # hydra's resolver
        setup.ModelRegistry = SimpleNamespace(model_arch_name_to_cls={})  # NeMo-Automodel's: no custom models
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        torch.manual_seed(0)
        out = []
        for case in cases:
            try:
                out.append(rates(setup, case["policy"], case["grpo_steps"], case["per_step"]))
            except Exception as error:  # NeMo-RL refuses the config: said, not raised
                out.append({"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()})
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
