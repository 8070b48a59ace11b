"""What a NeMo-RL job runs around NeMo-RL's driver, on its first node.

prepare: the job's inputs in the forms NeMo-RL loads, under <run dir>/nemo_rl: the policy in Hugging Face form
  (a checkpoint_megatron converted with rlsteps's own converter, a checkpoint_hf linked) and the prompts as
  NeMo-RL's rows. A requeued job finds them done and goes on; nothing is ever left half written.
finish: NeMo-RL's last complete checkpoint exported to Hugging Face form (NeMo-RL's converter, or
  nemo_rl_job.export), then written as the step's typed output artifact with its metadata.

NeMo-RL's GRPO (grpo_train, through its CheckpointManager) writes checkpoint_dir/tmp_step_N and renames it step_N
once whole; N is total_steps, the GRPO steps of the whole run. Its training_info.json holds GRPOSaveState:
consumed_samples (prompts), current_step (the step within the epoch: it restarts each epoch), current_epoch,
total_steps. keep_top_k may prune earlier step_N folders, never the latest.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

from rlsteps.contract.nemo_rl_job import NemoRlPaths, optimizer_steps_per_step
from rlsteps.engine.nemo_rl_stages.data import write_rows

log = logging.getLogger("rlsteps")
STEP_DIR = re.compile(r"step_(\d+)")  # NeMo-RL's finished checkpoints; tmp_step_N is one still being written
TRAINING_INFO = "training_info.json"
CONVERTERS = {  # NeMo-RL's converters to HF, per policy backend, relative to its checkout
    "dtensor": "examples/converters/convert_dcp_to_hf.py --config {config} --dcp-ckpt-path {weights} "
    "--hf-ckpt-path {hf_dir}",
    "megatron": "examples/converters/convert_megatron_to_hf.py --config {config} "
    "--megatron-ckpt-path {weights}/iter_0000000 --hf-ckpt-path {hf_dir}",
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


class NemoRlOutputError(RuntimeError):
    """NeMo-RL's run left nothing to export, or its export failed."""


def paths_of(cfg: Any) -> NemoRlPaths:
    """The run's NeMo-RL paths; a relative output.dir resolves in the job's working directory, as in the plan."""
    return NemoRlPaths(PurePosixPath(Path(cfg.output.dir).absolute()))


def prepare(cfg: Any, job: dict[str, Any]) -> None:
    from rlsteps.contract.hub import with_hub_snapshots
    from rlsteps.contract.input_check import check_inputs_in_job

    for checked in check_inputs_in_job(job.get("inputs_in_job") or []):
        log.info("input '%s': %s is a %s (checked in the job)", checked.name, checked.ref, checked.required_type)
    cfg = with_hub_snapshots(cfg, log.info)  # a policy or prompts given as Hub ids: their snapshots, fetched if need be
    paths = paths_of(cfg)
    place_policy(Path(cfg.inputs.policy), Path(paths.policy))
    agent = cfg.nemo_rl_job.gym_agent
    count = write_rows(cfg.inputs.prompts, Path(paths.train_data), cfg.algorithm, agent)
    log.info("%d training prompts as NeMo-RL rows: %s", count, paths.train_data)
    if cfg.inputs.val_prompts:
        count = write_rows(cfg.inputs.val_prompts, Path(paths.val_data), cfg.algorithm, agent)
        log.info("%d validation prompts as NeMo-RL rows: %s", count, paths.val_data)


def place_policy(source: Path, target: Path) -> None:
    """The policy where NeMo-RL loads it: converted to HF from checkpoint_megatron, else a link to the HF folder."""
    from rlsteps.contract.input_check import missing
    from rlsteps.engine.policy.model import is_megatron_checkpoint

    if target.exists():
        log.info("policy for NeMo-RL: %s (already prepared)", target)
        return
    if not source.exists():
        raise missing("policy", "inputs.policy", str(source), "checkpoint_megatron or checkpoint_hf")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not is_megatron_checkpoint(source):
        target.symlink_to(source.absolute(), target_is_directory=True)
        log.info("policy for NeMo-RL: %s -> %s (checkpoint_hf, linked)", target, source)
        return
    _convert_to_hf(source, target)


def _convert_to_hf(source: Path, target: Path) -> None:
    from rlsteps.engine.policy.model import load_policy, save_policy

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # an earlier attempt's, cut short
    model, tokenizer = load_policy(source, dtype="auto")
    save_policy(model, tokenizer, partial, "checkpoint_hf")
    partial.rename(target)
    size = sum(p.numel() for p in model.parameters())
    log.info(
        "policy for NeMo-RL: %s converted to HF at %s (%s parameters, %s)", source, target, f"{size:,}", model.dtype
    )


def last_checkpoint(checkpoints: Path) -> Path:
    """NeMo-RL's last finished checkpoint: step_N with the largest N (its total_steps) among those with their
    training_info.json, as NeMo-RL's own checkpoint history reads them."""
    steps = sorted(
        (int(match.group(1)), path)
        for path in (checkpoints.iterdir() if checkpoints.is_dir() else [])
        if path.is_dir() and (match := STEP_DIR.fullmatch(path.name)) and (path / TRAINING_INFO).is_file()
    )
    if not steps:
        raise NemoRlOutputError(f"NeMo-RL wrote no finished checkpoint (step_N) under {checkpoints}")
    return steps[-1][1]


def export_command(cfg: Any, checkpoint: Path, hf_dir: Path) -> list[str]:
    settings = cfg.nemo_rl_job
    template = settings.export or f"{settings.python} {CONVERTERS[settings.policy_backend]}"
    places = {
        "checkpoint": str(checkpoint),
        "weights": str(checkpoint / "policy" / "weights"),
        "config": str(checkpoint / "config.yaml"),
        "hf_dir": str(hf_dir),
    }
    return [word.format(**places) for word in shlex.split(template)]


def export_to_hf(cfg: Any, checkpoint: Path, hf_dir: Path) -> None:
    shutil.rmtree(hf_dir, ignore_errors=True)  # an earlier attempt's
    command = export_command(cfg, checkpoint, hf_dir)
    log.info("exporting %s to HF: %s", checkpoint, shlex.join(command))
    done = subprocess.run(command, cwd=cfg.nemo_rl_job.workdir)
    if done.returncode != 0:
        raise NemoRlOutputError(
            f"the export of {checkpoint} failed with exit code {done.returncode}: {shlex.join(command)}"
        )
    if not (hf_dir / "config.json").is_file():
        raise NemoRlOutputError(f"the export of {checkpoint} wrote no HF model (config.json) at {hf_dir}")


def copy_missing_tokenizer(sources: list[Path], hf_dir: Path) -> None:
    """A tokenizer beside exported weights that have none: the first of `sources` that holds one (the checkpoint's
    policy/tokenizer, which NeMo-RL saves with each checkpoint, then the policy it started from)."""
    if (hf_dir / "tokenizer_config.json").is_file():
        return
    source = next((s for s in sources if (s / "tokenizer_config.json").is_file()), None)
    for name in TOKENIZER_FILES if source else ():
        if (source / name).is_file():
            shutil.copy2(source / name, hf_dir / name)


def finish(cfg: Any, job: dict[str, Any]) -> Path:
    """NeMo-RL's last checkpoint as <output.dir>/policy in output.type; the artifact's path."""
    from rlsteps.contract.artifact import input_versions
    from rlsteps.engine.policy.model import load_policy
    from rlsteps.engine.records.output import write_policy_output

    paths = paths_of(cfg)
    checkpoint = last_checkpoint(Path(paths.checkpoints))
    counters = counters_of(checkpoint, cfg.model_dump(mode="json"))
    log.info("NeMo-RL's last checkpoint: %s (%s)", checkpoint, counters)
    hf_dir = Path(paths.exported)
    export_to_hf(cfg, checkpoint, hf_dir)
    copy_missing_tokenizer([checkpoint / "policy" / "tokenizer", Path(paths.policy)], hf_dir)
    model, tokenizer = load_policy(hf_dir, dtype="auto")
    versions = input_versions(cfg.inputs.model_dump())
    return write_policy_output(cfg, model, tokenizer, counters, job, versions, engine="nemo_rl")


def counters_of(checkpoint: Path, cfg: dict[str, Any]) -> dict[str, int]:
    """rlsteps's counters from NeMo-RL's GRPOSaveState: step = total_steps (the GRPO steps of the run; N of step_N
    without it), consumed_samples (prompts, as rlsteps counts them), epoch = current_epoch, and optimizer_steps
    (NeMo-RL makes a fixed number per GRPO step)."""
    info = json.loads((checkpoint / TRAINING_INFO).read_text())
    named = int(STEP_DIR.fullmatch(checkpoint.name).group(1))
    step = int(info.get("total_steps", named))
    if step != named:
        log.warning("%s holds total_steps %d (not %d as its name says); counting %d", checkpoint, step, named, step)
    counters = {"step": step}
    if "consumed_samples" in info:
        counters["consumed_samples"] = int(info["consumed_samples"])
    if "current_epoch" in info:
        counters["epoch"] = int(info["current_epoch"])
    counters["optimizer_steps"] = step * optimizer_steps_per_step(cfg)
    return counters
