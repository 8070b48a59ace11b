"""What Slurm itself does with the jobs rlsteps submits, read from Slurm (scontrol), never from the script's text.

A chain whose first stage fails ends with the stages after it CANCELLED, not pending forever; the multi-node and
GPU scripts are accepted by `sbatch --test-only`; a job's time limit brings Slurm's own USR1, the worker
checkpoints and the job is requeued and resumes. All on the real cluster that `.ci/slurm.sh up` starts.
"""

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from cli_helpers import REPO, invoke
from rlsteps.launch import slurm
from rlsteps.plan import submitted_jobs as jobs
from run_helpers import rlsteps
from test_launch_slurm import TINY_RUN, add_profile, needs_cluster, project, script_of, submitted_record  # noqa: F401

TINY = REPO / "examples" / "pipelines" / "tiny.yaml"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def slurm_job(job_id: str) -> dict[str, str]:
    """`scontrol show job`'s fields (the first value of each name); empty when Slurm does not know the job."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    if shown.returncode != 0:
        return {}
    return dict(re.findall(r"(?:^|\s)([A-Za-z:/]+)=(\S*)", shown.stdout))


def wait_for_state(job_id: str, states: set[str], timeout: float, poll_s: float = 0.5) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        job = slurm_job(job_id)
        if job.get("JobState") in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} not {'/'.join(sorted(states))} after {timeout}s: {job}"
        time.sleep(poll_s)


@pytest.fixture
def cwd(project):  # noqa: F811
    """The project; every job the test submitted from it and still live at its end is cancelled."""
    yield project
    for record in jobs.find_records([project / ".rlsteps" / "jobs"]):
        if slurm_job(record.job_id).get("JobState") not in ENDED:
            subprocess.run(["scancel", record.job_id], capture_output=True, timeout=30)


# ----- a failed stage cancels the stages that wait on it ----------------------------------------------------------


@needs_cluster
def test_a_pipeline_whose_first_stage_exits_1_ends_with_the_stages_after_it_cancelled(tiny_world, cwd):
    """The first job to start (the first stage: the others wait on it) exits 1 before its worker; any other one
    would go on. Slurm, not rlsteps, ends the rest: without --kill-on-invalid-dep they would pend forever
    (Reason=DependencyNeverSatisfied)."""
    marker = cwd / "a-stage-started"
    add_profile(
        cwd,
        "  chain:\n    executor: slurm\n    cpus_per_task: 1\n    mem: 500M\n    time: '00:05:00'\n"
        f"    setup_lines: ['if mkdir {marker} 2>/dev/null; then echo first stage fails; exit 1; fi']\n",
    )
    submitted = invoke("pipeline", "run", str(TINY), "-b", "chain")
    assert submitted.exit_code == 0, submitted.output
    chain = json.loads((cwd / ".rlsteps" / "pipelines" / "tiny" / "chain.json").read_text())["jobs"]
    (first, rs), (second, reinforce), (third, rlhf) = [(j["job_id"], j["stage"]) for j in chain]
    assert (rs, reinforce, rlhf) == ("rs", "reinforce", "rlhf")
    # afterok on the first stage: still unfulfilled, or already failed when the first stage failed before this look
    assert slurm_job(second)["Dependency"] in (f"afterok:{first}(unfulfilled)", f"afterok:{first}(failed)")

    failed = wait_for_state(first, ENDED, timeout=120)
    assert (failed["JobState"], failed["ExitCode"]) == ("FAILED", "1:0"), failed
    started = time.monotonic()
    for job_id in (second, third):
        ended = wait_for_state(job_id, ENDED, timeout=90)
        assert ended["JobState"] == "CANCELLED" and ended["Reason"] == "DependencyNeverSatisfied", ended
        assert ended["Dependency"].endswith("(failed)"), ended
        assert (ended["EligibleTime"], ended["NodeList"]) == ("Unknown", ""), ended  # never eligible, never ran
        assert not Path(ended["StdOut"]).exists()
    print(f"stages after the failed one cancelled {time.monotonic() - started:.1f}s after its failure")
    assert marker.is_dir()  # made once: by the first stage only
    for job_id in (second, third):
        record = jobs.find_job(job_id)
        assert record is not None and jobs.job_status(record).state.name == "CANCELLED"


# ----- the multi-node and GPU scripts, judged by sbatch --test-only ------------------------------------------------

GPU_PROFILES = """\
  gpus1: {executor: slurm, batch_partition: debug, gpus_per_node: 8, cpus_per_task: 1, mem: 1G, time: "04:00:00"}
  gpus2:
    executor: slurm
    account: proj
    batch_partition: debug
    nodes: 2
    gpus_per_node: 8
    mem: 0
    time: "04:00:00"
    exclusive: true
    requeue: true
    env_vars: {HF_HOME: /lustre/hf}
  nemo_rl2:
    executor: slurm
    nodes: 2
    gpus_per_node: 8
    time: "04:00:00"
    container_image: /images/nemo-rl.sqsh
    python: python
    cluster_paths: [/lustre]
"""
NEMO_RL_INPUTS = ("inputs.prompts=/lustre/p.jsonl", "inputs.policy=/lustre/sft", "inputs.judge_model=/lustre/judge")
WILL_START = re.compile(r"sbatch: Job \d+ to start at \S+ using \d+ processors on nodes (\S+) in partition debug")


def sbatch_test_only(script: str, where: Path) -> subprocess.CompletedProcess:
    """sbatch --test-only: Slurm reads the #SBATCH lines and says where and when the job would run; nothing is
    submitted."""
    path = where / "test-only.sh"
    path.write_text(script)
    return subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=60)


@needs_cluster
def test_the_multi_node_and_gpu_scripts_are_accepted_by_sbatch_test_only(cwd):
    """The cluster (.ci/slurm.sh) has 2 nodes with 8 stand-in GPUs each, so Slurm checks the GPU requests; a request
    one GPU or one node too large is refused (the check has teeth)."""
    from rlsteps.catalog import load_catalog
    from rlsteps.plan.runner import RunRequest, compile_request

    add_profile(cwd, GPU_PROFILES)
    nemo_rl = RunRequest(
        step="rlhf", config="default", overrides=("engine=nemo_rl", *NEMO_RL_INPUTS), batch_profile="nemo_rl2"
    )
    scripts = {
        "1 node x 8 GPUs": script_of("gpus1", overrides=("train.micro_batch_size=2",)),
        "2 nodes x 8 GPUs, exclusive": script_of("gpus2"),
        "NeMo-RL's Ray job on 2 nodes x 8 GPUs": compile_request(load_catalog(), nemo_rl).plan.files[slurm.SCRIPT_FILE],
    }
    for name, script in scripts.items():
        assert re.search(r"^#SBATCH --gpus-per-node=8$", script, re.MULTILINE), name
        done = sbatch_test_only(script, cwd)
        will_start = WILL_START.search(done.stderr)
        assert done.returncode == 0 and will_start, f"{name}: {done.stderr}"
        print(f"{name}: {will_start[0]}")
        assert will_start[1] in (("node[1-2]",) if "2 nodes" in name else ("node1", "node2")), name
    too_big = {
        "9 GPUs per node": scripts["2 nodes x 8 GPUs, exclusive"].replace("--gpus-per-node=8", "--gpus-per-node=9"),
        "3 nodes": scripts["2 nodes x 8 GPUs, exclusive"].replace("#SBATCH --nodes=2", "#SBATCH --nodes=3"),
    }
    for name, script in too_big.items():
        assert script != scripts["2 nodes x 8 GPUs, exclusive"], name
        done = sbatch_test_only(script, cwd)
        assert done.returncode != 0 and "Requested node configuration is not available" in done.stderr, (name, done)


# ----- the time limit: Slurm's own USR1, a checkpoint, a requeue ---------------------------------------------------


@needs_cluster
@pytest.mark.slow
def test_slurm_signals_usr1_before_the_time_limit_and_the_job_checkpoints_requeues_and_resumes(tiny_world, cwd):
    """A 2-minute limit (Slurm's least but one) and USR1@60 (the least rlsteps allows). slurmctld looks at time
    limits every 30 s and sends the signal at the first look with under 60 + 30 s left: 30 to 60 s after the start,
    the worker's handler long in place, and the limit's own end at a later look, 30 s or more after the signal. The
    requeued job may start 31 s after its requeue (cred_expire, .ci/slurm.sh). Nothing here signals the job: without
    --signal it would run into its limit, and the log would never say it checkpointed."""
    add_profile(
        cwd,
        "  limit:\n    extends: ci\n    time: 2\n    checkpoint_before_limit_s: 60\n    requeue: true\n",
    )
    done = rlsteps("run", "rs", *TINY_RUN, "-b", "limit", "train.max_steps=100000", cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    record = submitted_record(cwd)
    script = (Path(record.job_dir) / slurm.SCRIPT_FILE).read_text()
    assert "#SBATCH --signal=USR1@60" in script and "#SBATCH --time=2" in script

    first = wait_for_state(record.job_id, {"RUNNING"}, timeout=60)
    started = time.monotonic()
    assert first["TimeLimit"] == "00:02:00" and first["Restarts"] == "0", first
    log = Path(first["StdOut"])
    seen: dict[str, float] = {}
    deadline = started + 200  # about 100 s: the signal at 30-60 s, 31 s before the requeued job may start
    while "resumed" not in seen:
        text = log.read_text() if log.exists() else ""
        for key, line in (
            ("stepping", "step 1/100000"),
            ("checkpointed", "as asked (SIGUSR1"),
            ("requeued", "requeueing job"),
            ("resumed", "resuming from"),
        ):
            if key not in seen and line in text:
                seen[key] = time.monotonic() - started
        assert time.monotonic() < deadline, f"after {deadline - started:.0f}s, seen {seen}:\n{text}"
        time.sleep(0.5)
    print(f"seconds after the job started: {', '.join(f'{k} {v:.1f}' for k, v in seen.items())}")
    assert seen["checkpointed"] <= seen["requeued"] <= seen["resumed"]
    assert 25 <= seen["checkpointed"] < 75, seen  # the signal's window, and well before the 120 s limit
    again = slurm_job(record.job_id)
    assert again["Restarts"] == "1" and again["JobState"] in {"RUNNING", "COMPLETING"}, again
    match = re.search(r"checkpoint written at step (\d+) of 100000", log.read_text())
    resumed = re.search(r"resuming from \S+ \(step (\d+),", log.read_text())
    assert match and resumed and match[1] == resumed[1] and int(match[1]) >= 1, log.read_text()
    assert "TIMEOUT" not in log.read_text() and "DUE TO TIME LIMIT" not in log.read_text()
