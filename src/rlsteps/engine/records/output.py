"""The step's output artifact, <output.dir>/policy: the policy in output.type, with the metadata a pipeline reads
(producer, config hash, inputs and their versions, counters). Written by the worker at the end of a run, and by
the NeMo-RL job's finish stage from NeMo-RL's last checkpoint. A LoRA run's output is the merged policy, and its
adapters as peft saves them in <output.dir>/adapter beside it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("rlsteps")
OUTPUT_NAME = "policy"  # the output artifact is <output.dir>/policy, as every manifest names it
NON_FINITE_OUTPUT_FIX = "nothing was written to output.dir; lower train.lr or train.max_grad_norm and run again"


def job_record(config_path: Path) -> dict[str, Any]:
    """The job.yaml beside a job's config.yaml (who compiled it, its inputs on cluster paths); {} without one."""
    from omegaconf import OmegaConf

    job_file = config_path.parent / "job.yaml"
    return OmegaConf.to_container(OmegaConf.load(job_file)) if job_file.is_file() else {}


def write_policy_output(
    cfg: Any,
    model: Any,
    tokenizer: Any,
    counters: dict[str, int],
    job: dict[str, Any],
    versions: dict[str, str],
    engine: str = "embedded",
) -> Path:
    """<output.dir>/policy in cfg.output.type, written whole or not at all (engine.artifact.write_artifact)."""
    from rlsteps.contract.artifact import config_hash, write_artifact
    from rlsteps.engine.checkpoints.finite import refuse_non_finite
    from rlsteps.engine.policy.lora import ADAPTER_DIR, has_adapters, merged_model, save_adapter
    from rlsteps.engine.policy.model import save_policy
    from rlsteps.install import source, version

    form = cfg.output.type
    metadata = {
        "type": form,
        "producer": {
            "step": job.get("job", {}).get("step"),
            "job": job.get("job", {}).get("name"),
            "algorithm": cfg.algorithm,
            "engine": engine,
            "rlsteps": {"version": version(), "source": source()},
        },
        "config_hash": config_hash(cfg.model_dump(mode="json")),
        "inputs": {name: ref for name, ref in cfg.inputs.model_dump().items() if ref},
        "input_versions": versions,  # what a pipeline compares to skip a stage
        "counters": counters,
    }
    iteration = counters.get("optimizer_steps", counters.get("step", 0))
    if has_adapters(model):  # the adapters as peft saves them, then the merged policy, which the next step reads
        metadata["lora_adapter"] = str(save_adapter(model, Path(cfg.output.dir) / ADAPTER_DIR))
        log.info("LoRA adapters (peft): %s", metadata["lora_adapter"])
        model = merged_model(model)
    refuse_non_finite(model, "at the end of the run, before its output is written", fix=NON_FINITE_OUTPUT_FIX)
    target = write_artifact(
        Path(cfg.output.dir) / OUTPUT_NAME, lambda d: save_policy(model, tokenizer, d, form, iteration), metadata
    )
    log.info("output artifact (%s): %s", form, target)
    return target
