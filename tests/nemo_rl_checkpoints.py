"""NeMo-RL's GRPO checkpoints written through NeMo-RL's own CheckpointManager (nemo_rl/utils/checkpoint.py, the
pinned source, real torch), laid out as its DTensor v2 policy worker saves a policy. Run in a process of its own
(tests/upstream.py's stand-ins stay in sys.modules): by tests/nemo_rl_standin.py, and as

    python nemo_rl_checkpoints.py RUN.json

RUN: {"master": <master config>, "policy": HF dir, "steps_per_epoch": n, "scale_per_step": s, "cut_short": bool}:
grpo_train's loop (grpo.py) over grpo.max_num_epochs and grpo.max_num_steps, saving every checkpointing.save_period
steps and on the last, with GRPOSaveState's counters; the policy saved at total step t is the HF policy's weights
times 1 + s * t. cut_short: then a next checkpoint begun (tmp_step_N) and never finalized, as a job killed while
saving leaves it.

The step folder (grpo_train, then DTensorPolicyWorkerV2.save_checkpoint through NeMo-Automodel's Checkpointer with
model_save_format safetensors and save_consolidated false):
    step_N/training_info.json          GRPOSaveState: consumed_samples, current_step, current_epoch, total_steps, ...
    step_N/config.yaml                 the master config
    step_N/policy/weights/model/       shard-00001-model-00001-of-00001.safetensors (HF names), .hf_metadata/
    step_N/policy/optimizer/optim/     the optimizer's state (torch distributed checkpoint)
    step_N/policy/tokenizer/           tokenizer.save_pretrained
    step_N/train_dataloader.pt         the dataloader's state
"""

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import upstream  # noqa: E402

SHARD = "shard-00001-model-00001-of-00001.safetensors"  # NeMo-Automodel's HF storage writer, one rank
HF_METADATA = ("config.json", "generation_config.json")
TOKENIZER = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def manager_class():
    """NeMo-RL's CheckpointManager, imported from the pinned source (call inside upstream.nemo_rl_importable)."""
    from nemo_rl.utils.checkpoint import CheckpointManager

    return CheckpointManager


def save_policy(policy_dir: Path, hf_dir: Path, scale: float = 1.0) -> None:
    """policy/ as the DTensor v2 worker saves it: the HF policy's weights (times `scale`) as a safetensors shard
    with its HF metadata, an optimizer state, the tokenizer."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file, save_file

    weights = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_file(file))
    weights = {name: (tensor * scale).contiguous() for name, tensor in weights.items()}
    model_dir = policy_dir / "weights" / "model"
    (model_dir / ".hf_metadata").mkdir(parents=True)
    save_file(weights, model_dir / SHARD, metadata={"format": "pt"})
    for name in HF_METADATA:
        if (hf_dir / name).is_file():
            shutil.copy2(hf_dir / name, model_dir / ".hf_metadata" / name)
    optimizer_state = {
        name: {"exp_avg": torch.zeros_like(t), "exp_avg_sq": torch.zeros_like(t)} for name, t in weights.items()
    }
    dcp.save({"optim": {"state": optimizer_state}}, checkpoint_id=str(policy_dir / "optimizer" / "optim"), no_dist=True)
    (policy_dir / "tokenizer").mkdir()
    for name in TOKENIZER:
        if (hf_dir / name).is_file():
            shutil.copy2(hf_dir / name, policy_dir / "tokenizer" / name)


def save_step(manager, total_steps: int, save_state: dict, master: dict, hf_dir: Path, scale: float = 1.0) -> Path:
    """One checkpoint as grpo_train writes it: init_tmp_checkpoint, the policy, the dataloader, finalize."""
    import torch
    from pydantic import BaseModel

    class RunConfig(BaseModel, extra="allow"):  # grpo_train passes its MasterConfig (a pydantic model)
        pass

    path = Path(manager.init_tmp_checkpoint(total_steps, save_state, RunConfig(**master)))
    save_policy(path / "policy", hf_dir, scale)
    torch.save({"sampler": {"consumed": save_state["consumed_samples"]}}, path / "train_dataloader.pt")
    manager.finalize_checkpoint(path)
    return path.with_name(f"step_{total_steps}")


def run(spec: dict) -> None:
    """grpo_train's checkpointing over its epochs and steps (grpo.py at the pinned version)."""
    master, hf_dir = spec["master"], Path(spec["policy"])
    grpo, checkpointing = master["grpo"], master["checkpointing"]
    manager = manager_class()(checkpointing)
    steps_per_epoch, total_steps, consumed = spec["steps_per_epoch"], 0, 0
    for epoch in range(grpo["max_num_epochs"]):
        for current_step in range(steps_per_epoch):
            consumed += grpo["num_prompts_per_step"]
            is_last = total_steps + 1 >= grpo["max_num_steps"] or (
                epoch + 1 == grpo["max_num_epochs"] and current_step + 1 == steps_per_epoch
            )
            if is_last or (total_steps + 1) % checkpointing["save_period"] == 0:
                state = {
                    "consumed_samples": consumed,
                    "current_step": current_step + 1,
                    "current_epoch": epoch,
                    "total_steps": total_steps + 1,
                    "total_valid_tokens": 0,
                }
                scale = 1.0 + spec["scale_per_step"] * (total_steps + 1)
                save_step(manager, total_steps + 1, state, master, hf_dir, scale)
            total_steps += 1
            if total_steps >= grpo["max_num_steps"]:
                break
        if total_steps >= grpo["max_num_steps"]:
            break
    if spec.get("cut_short"):
        state = {
            "consumed_samples": consumed + 1,
            "current_step": 0,
            "current_epoch": 0,
            "total_steps": total_steps + 1,
        }
        path = Path(manager.init_tmp_checkpoint(total_steps + 1, state))
        save_policy(path / "policy", hf_dir, 0.0)


if __name__ == "__main__":
    with upstream.nemo_rl_importable(stub=upstream.HEAVY - {"torch"}):
        run(json.loads(Path(sys.argv[1]).read_text()))
