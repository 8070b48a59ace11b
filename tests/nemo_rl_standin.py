"""Stands in for NeMo-RL's GRPO driver and its checkpoint converter (which need NeMo-RL and GPUs) in a Ray job.

driver:  python nemo_rl_standin.py --config MASTER_CONFIG
    Joins the job's Ray cluster, checks that every node of `cluster.num_nodes` is alive and runs a task on each,
    then writes a checkpoint the way NeMo-RL lays one out (step_N/config.yaml, training_info.json,
    policy/weights/: here the policy's HF files unchanged) and exits with $STANDIN_EXIT (default 0).
export:  python nemo_rl_standin.py export WEIGHTS HF_DIR
    Copies the weights folder to HF_DIR, as NeMo-RL's converter would write it.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import ray
import yaml
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
def where() -> str:
    return ray.get_runtime_context().get_node_id()


def drive(master_path: Path) -> int:
    master = yaml.safe_load(master_path.read_text())
    ray.init(address="auto", log_to_driver=False)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    expected = master["cluster"]["num_nodes"]
    assert len(nodes) == expected, f"{len(nodes)} Ray nodes alive, the job has {expected}"
    ran_on = ray.get(
        [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
    )
    assert sorted(ran_on) == sorted(nodes), "a node did not run its task"
    print(f"stand-in: {len(nodes)} Ray nodes joined and each ran a task", flush=True)
    step = master["grpo"]["max_num_steps"]
    checkpoint = Path(master["checkpointing"]["checkpoint_dir"]) / f"step_{step}"
    shutil.copytree(master["policy"]["model_name"], checkpoint / "policy" / "weights")
    shutil.copy(master_path, checkpoint / "config.yaml")
    info = {
        "current_step": step,
        "total_steps": step,
        "consumed_samples": step * master["grpo"]["num_prompts_per_step"],
    }
    (checkpoint / "training_info.json").write_text(json.dumps(info))
    return int(os.environ.get("STANDIN_EXIT", "0"))


if __name__ == "__main__":
    if sys.argv[1] == "export":
        shutil.copytree(sys.argv[2], sys.argv[3], dirs_exist_ok=True)
        sys.exit(0)
    sys.exit(drive(Path(sys.argv[sys.argv.index("--config") + 1])))
