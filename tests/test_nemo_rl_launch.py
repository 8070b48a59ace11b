"""engine=nemo_rl launched: the files a dry run shows (Slurm, Lepton), then a real Ray job on the real Slurm cluster.

The cluster jobs run the real node script, real Ray (head on the first node, a worker joining from the second)
and rlsteps's real prepare and finish stages; only NeMo-RL's driver and converter are stood in for
(tests/nemo_rl_standin.py), since they need NeMo-RL and GPUs.
"""

import os
import shlex
import sys
from pathlib import Path

import pytest
import yaml

import required
from rlsteps.artifacts.detect import detect_types
from rlsteps.catalog import load_catalog
from rlsteps.contract.nemo_rl_job import MASTER_CONFIG_FILE, NODE_SCRIPT_FILE
from rlsteps.errors import UsageError
from rlsteps.launch import slurm
from rlsteps.plan.runner import RunRequest, compile_request
from run_helpers import artifact_metadata, rlsteps
from test_launch_slurm import needs_cluster

STANDIN = Path(__file__).with_name("nemo_rl_standin.py")
CLUSTER_INPUTS = ("inputs.prompts=/lustre/p.jsonl", "inputs.policy=/lustre/sft", "inputs.judge_model=/lustre/judge")
PROFILES = """\
profiles:
  gpus:
    executor: slurm
    nodes: 2
    gpus_per_node: 8
    time: "04:00:00"
    container_image: /images/nemo-rl.sqsh
    python: python
    cluster_paths: [/lustre]
  ray2:
    executor: slurm
    nodes: 2
    cpus_per_task: 1
    mem: 3G
    time: "00:15:00"
  lepton:
    executor: lepton
    node_group: group
    resource_shape: gpu.8xh100-80gb
    container_image: nvcr.io/nvidia/nemo-rl:v0.7.0
    nodes: 2
    gpus_per_node: 8
    mounts: [{path: /shared, mount_path: /data, from: "node-nfs:fs"}]
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text(PROFILES)
    return tmp_path


def compiled(step: str, profile: str, *overrides: str, config: str = "default"):
    request = RunRequest(step=step, config=config, overrides=("engine=nemo_rl", *overrides), batch_profile=profile)
    return compile_request(load_catalog(), request)


def test_the_slurm_dry_run_shows_the_master_config_the_node_script_and_one_task_per_node(project):
    plan = compiled("rlhf", "gpus", *CLUSTER_INPUTS).plan
    master = yaml.safe_load(plan.files[MASTER_CONFIG_FILE])
    # the policy's node and the judge's node of its own (placement)
    assert (master["cluster"]["num_nodes"], master["env"]["nemo_gym"]["num_gpu_nodes"]) == (1, 1)
    assert master["checkpointing"]["checkpoint_dir"] == str(
        project / ".rlsteps/runs/rl_rlhf-default/nemo_rl/checkpoints"
    )
    assert "# Where NeMo-RL's semantics differ" in plan.files[MASTER_CONFIG_FILE]
    script = plan.files[slurm.SCRIPT_FILE]
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 --wait=60" in srun
    assert "--container-image=/images/nemo-rl.sqsh" in srun
    assert srun.endswith(f'/{NODE_SCRIPT_FILE} "$attempt"')
    assert "--signal" not in script  # NeMo-RL saves on its own schedule and resumes by itself
    assert 'attempt="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"' in script
    node = plan.files[NODE_SCRIPT_FILE]
    assert "examples/nemo_gym/run_grpo_nemo_gym.py --config" in node and "nodes=2" in node and "gpus=8" in node
    assert "one task" in plan.summary


def test_reinforce_runs_nemo_rls_plain_grpo_driver(project):
    inputs = ("inputs.prompts=/lustre/p.jsonl", "inputs.policy=/lustre/sft", "inputs.reward_model=/lustre/rm")
    node = compiled("reinforce", "gpus", *inputs).plan.files[NODE_SCRIPT_FILE]
    assert "driver=(uv run python examples/run_grpo.py --config" in node


def test_a_nemo_rl_job_needs_gpus_unless_its_driver_is_its_own(project):
    with pytest.raises(UsageError, match="engine=nemo_rl needs GPUs"):
        compiled("rlhf", "ray2", *CLUSTER_INPUTS)
    plan = compiled("rlhf", "ray2", *CLUSTER_INPUTS, "nemo_rl_job.driver=python train.py").plan
    assert "driver=(python train.py --config" in plan.files[NODE_SCRIPT_FILE]


def test_here_a_nemo_rl_job_is_refused_with_the_way_to_run_it(project):
    request = RunRequest(step="rlhf", config="tiny", overrides=("engine=nemo_rl",))
    with pytest.raises(UsageError, match="inside NeMo-RL's container") as refused:
        compile_request(load_catalog(), request)
    assert "-r or -b" in refused.value.fix


def test_the_lepton_spec_runs_the_node_script_in_every_replica(project):
    required.importorskip("leptonai", switch="LEPTON")
    overrides = (*CLUSTER_INPUTS, "output.dir=/data/runs/rlhf")
    plan = compiled("rlhf", "lepton", *overrides).plan
    master = yaml.safe_load(plan.files[MASTER_CONFIG_FILE])
    assert master["policy"]["model_name"] == "/data/runs/rlhf/nemo_rl/policy_hf"
    spec = yaml.safe_load(plan.files["lepton_job.json"])["spec"]
    assert spec["completions"] == spec["parallelism"] == 2 and spec["intra_job_communication"] is True
    entry = spec["container"]["command"][-1]
    try_name = '"${LEPTON_JOB_NAME:-job}-${LEPTON_JOB_FAILURE_COUNT:-0}"'  # replica 0 names the try's attempt
    assert entry.rstrip().endswith(f"/{NODE_SCRIPT_FILE} --try {try_name}")


def test_on_lepton_the_run_directory_must_be_on_a_mount(project):
    required.importorskip("leptonai", switch="LEPTON")
    (project / "rlsteps.yaml").write_text(
        PROFILES.replace('    mounts: [{path: /shared, mount_path: /data, from: "node-nfs:fs"}]\n', "")
    )
    with pytest.raises(UsageError, match="needs a shared mount"):
        compiled("rlhf", "lepton", *CLUSTER_INPUTS)


def _standin_run(project: Path, monkeypatch, *extra: str, timeout: float = 600):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # ray's CLI
    python = shlex.quote(sys.executable)
    return rlsteps(
        "run", "reinforce", "-c", "tiny", "-r", "ray2", "engine=nemo_rl", "train.max_steps=3",
        f"nemo_rl_job.workdir={project}",
        f"nemo_rl_job.driver={python} {STANDIN}",
        f"nemo_rl_job.export={python} {STANDIN} export {{weights}} {{hf_dir}}",
        "nemo_rl_job.nodes_timeout_s=240",
        *extra,
        cwd=project,
        timeout=timeout,
    )  # fmt: skip


@needs_cluster
@pytest.mark.slow
def test_a_two_node_ray_job_on_slurm_starts_head_and_worker_and_returns_a_typed_checkpoint(
    tiny_world, project, monkeypatch
):
    done = _standin_run(project, monkeypatch)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "Ray head at" in log and "2 of 2 node(s) up" in log
    assert "stand-in: 2 Ray nodes joined and each ran a task" in log
    run = project / ".rlsteps" / "runs" / "rl_reinforce-tiny"
    assert "checkpoint_megatron" in detect_types(load_catalog(), str(run / "policy"))
    written = artifact_metadata(run)
    assert written["counters"]["step"] == 3 and written["producer"]["engine"] == "nemo_rl"
    [state] = (run / "nemo_rl" / "ray").iterdir()  # one attempt: its recorded exit code and end marker
    assert (state / "exit_code").read_text().strip() == "0" and (state / "ended").exists()


@needs_cluster
@pytest.mark.slow
def test_the_drivers_exit_code_is_the_jobs_and_nothing_is_written(tiny_world, project, monkeypatch):
    monkeypatch.setenv("STANDIN_EXIT", "7")
    done = _standin_run(project, monkeypatch)
    log = done.stdout + done.stderr
    assert done.returncode == 1, log  # the run failed: rlsteps's exit code; the job's own is 7
    assert "NeMo-RL's driver failed (exit 7)" in log and "exit code 7" in log
    run = project / ".rlsteps" / "runs" / "rl_reinforce-tiny"
    assert not (run / "policy").exists()


def test_a_pipeline_chains_an_embedded_stage_into_a_nemo_rl_stage(tiny_world, project):
    from rlsteps.plan.pipeline import PipelineRequest, load_pipeline, plan_pipeline

    tiny = Path(__file__).resolve().parents[1] / "examples" / "pipelines" / "tiny.yaml"
    overrides = ("reinforce:engine=nemo_rl", "train.micro_batch_size=1")
    request = PipelineRequest(path=tiny, batch_profile="gpus", overrides=overrides)
    rs, reinforce, rlhf = plan_pipeline(load_catalog(), load_pipeline(tiny), request)
    assert rs.compiled.job.config["engine"] == "embedded" and MASTER_CONFIG_FILE not in rs.compiled.plan.files
    rs_output = rs.outputs["policy"][1]
    assert reinforce.compiled.job.config["inputs"]["policy"] == rs_output  # converted to HF in the job, then loaded
    master = yaml.safe_load(reinforce.compiled.plan.files[MASTER_CONFIG_FILE])
    assert master["policy"]["model_name"].endswith("/nemo_rl/policy_hf")
    assert rlhf.compiled.job.config["inputs"]["policy"] == reinforce.outputs["policy"][1]  # its typed output, chained
