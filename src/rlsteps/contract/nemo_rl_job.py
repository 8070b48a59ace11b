"""What the compile of a NeMo-RL job (rlsteps.nemo_rl) and the stages it runs (rlsteps.engine.nemo_rl_stages) agree
on: where the job keeps its files (all under <run dir>/nemo_rl, on the filesystem every node sees), and how many
optimizer steps NeMo-RL makes a GRPO step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

MASTER_CONFIG_FILE = "nemo_rl.yaml"  # in the job directory: the compiled master config (the dry run prints it)
NODE_SCRIPT_FILE = "ray_node.sh"  # in the job directory: what every node of the job runs


@dataclass(frozen=True)
class NemoRlPaths:
    run_dir: PurePosixPath  # absolute: NeMo-RL's driver runs in its own working directory

    @property
    def root(self) -> PurePosixPath:
        return self.run_dir / "nemo_rl"

    @property
    def policy(self) -> PurePosixPath:
        """The policy in the Hugging Face form NeMo-RL loads (converted from checkpoint_megatron, or a link)."""
        return self.root / "policy_hf"

    @property
    def train_data(self) -> PurePosixPath:
        return self.root / "data" / "train.jsonl"

    @property
    def val_data(self) -> PurePosixPath:
        return self.root / "data" / "validation.jsonl"

    @property
    def checkpoints(self) -> PurePosixPath:
        return self.root / "checkpoints"

    @property
    def logs(self) -> PurePosixPath:
        return self.root / "logs"

    @property
    def exported(self) -> PurePosixPath:
        """NeMo-RL's last checkpoint written in HF form, before it becomes the output artifact."""
        return self.root / "exported_hf"

    def ray_state(self, attempt: str) -> PurePosixPath:
        """One attempt's Ray state: the head's address, the end marker, the driver's exit code."""
        return self.root / "ray" / attempt


def optimizer_steps_per_step(cfg: dict[str, Any]) -> int:
    """Optimizer steps NeMo-RL makes per GRPO step: one per train_global_batch_size rows (its num_global_batches)."""
    rollout, train = cfg["rollout"], cfg["train"]
    rows = rollout["prompts_per_step"] * rollout["num_rollouts_per_prompt"]
    return max(1, rows // train["global_batch_size"])
