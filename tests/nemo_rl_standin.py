"""Stands in for NeMo-RL's GRPO driver and its checkpoint converter (which need NeMo-RL and GPUs) in a Ray job.

driver:  python nemo_rl_standin.py --config MASTER_CONFIG
    Checks the master config as NeMo-RL would take it (upstream.check_master_config; exits 2 with the problems),
    joins the job's Ray cluster, checks that every node of `cluster.num_nodes` is alive and runs a task on each, then
    "trains": grpo_train's checkpoints written through NeMo-RL's own CheckpointManager in NeMo-RL's layout
    (tests/nemo_rl_checkpoints.py: step_N/training_info.json, config.yaml, policy/weights/model/*.safetensors,
    policy/optimizer, policy/tokenizer), the policy's weights scaled by 1 + SCALE_PER_STEP * N at total step N, over
    as many epochs as grpo.max_num_steps takes through the prompts. Exits with $STANDIN_EXIT (default 0).
export:  python nemo_rl_standin.py export WEIGHTS HF_DIR
    WEIGHTS (policy/weights) as an HF folder, as NeMo-RL's converter writes it: the shards merged into
    model.safetensors, with the config saved beside them.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import upstream  # noqa: E402

SCALE_PER_STEP = 0.001


def join_ray(expected: int) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def where() -> str:
        return ray.get_runtime_context().get_node_id()

    ray.init(address="auto", log_to_driver=False)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == expected, f"{len(nodes)} Ray nodes alive, the job has {expected}"
    ran_on = ray.get(
        [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
    )
    assert sorted(ran_on) == sorted(nodes), "a node did not run its task"
    print(f"stand-in: {len(nodes)} Ray nodes joined and each ran a task", flush=True)
    ray.shutdown()


def steps_per_epoch(master: dict) -> int:
    """GRPO steps of one pass over the training rows (NeMo-RL's dataloader drops the last partial batch)."""
    rows = Path(master["data"]["train"]["data_path"]).read_text().splitlines()
    return max(1, sum(1 for row in rows if row.strip()) // master["grpo"]["num_prompts_per_step"])


def write_checkpoints(master: dict) -> None:
    """grpo_train's checkpoints (tests/nemo_rl_checkpoints.py, a process of its own: NeMo-RL's stand-ins for its
    heavy modules stay in sys.modules)."""
    spec = {
        "master": master,
        "policy": master["policy"]["model_name"],
        "steps_per_epoch": steps_per_epoch(master),
        "scale_per_step": SCALE_PER_STEP,
    }
    with tempfile.TemporaryDirectory() as scratch:
        spec_file = Path(scratch) / "run.json"
        spec_file.write_text(json.dumps(spec))
        subprocess.run([sys.executable, str(HERE / "nemo_rl_checkpoints.py"), str(spec_file)], check=True)


def drive(master_path: Path) -> int:
    master = yaml.safe_load(master_path.read_text())
    driver = "nemo_gym" if "nemo_gym" in master["env"] else "grpo"  # run_grpo_nemo_gym.py, else run_grpo.py
    problems = upstream.check_master_config(master, driver)
    if problems:
        print("stand-in: NeMo-RL would not take this master config:", *problems, sep="\n  ", file=sys.stderr)
        return 2
    join_ray(master["cluster"]["num_nodes"])
    write_checkpoints(master)
    return int(os.environ.get("STANDIN_EXIT", "0"))


def export(weights: Path, hf_dir: Path) -> None:
    from safetensors.torch import load_file, save_file

    model_dir = weights / "model"
    merged = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        merged.update(load_file(shard))
    hf_dir.mkdir(parents=True, exist_ok=True)
    save_file(merged, hf_dir / "model.safetensors", metadata={"format": "pt"})
    for file in (model_dir / ".hf_metadata").iterdir():
        shutil.copy2(file, hf_dir / file.name)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(Path(sys.argv[2]), Path(sys.argv[3]))
        sys.exit(0)
    sys.exit(drive(Path(sys.argv[sys.argv.index("--config") + 1])))
