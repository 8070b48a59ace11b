"""Runs NeMo-RL's own GRPO driver on master configs, on a CPU: its config handling, grpo.setup and GRPO steps, with
only the GPU work stood in (tests/nemo_rl_gpu_standins.py for vLLM's engine, the policy workers' forward and backward,
torch.cuda's answers and NeMo-Gym's server processes), over Ray: a real one, or the in-process stand-in.

    python tests/nemo_rl_run.py CASES.json --result OUT.json

CASES.json is a list of {"name", "config" (a master config YAML), "driver" (grpo | nemo_gym), "nodes",
"gpus_per_node" (the job's Ray cluster), "steps", "ray" (optional: "real")}. The config's files (policy.model_name,
data.*.data_path) must exist: the job's prepare stage writes them. Each case is the driver's `main()` as the job starts
it (`python examples/...py --config CONFIG`), with grpo.max_num_steps cut to `steps` and a checkpoint saved at each
step, so that the data path, the loss, the checkpoint manager and the logger all run. OUT.json gets {name: {"ok":
true, "steps": N, "checkpoint": ..., "placements": [...]} or {"ok": false, "error": "...", "where":
"nemo_rl/...py:LINE"}} (where NeMo-RL's code stopped), each with the run's printed log, its wall time and the placement
groups NeMo-RL and NeMo-Gym asked Ray for (tests/nemo_rl_real_ray.placement_groups). Run it as a process of its own.

Ray: a case with "ray": "real" runs on a real Ray cluster of one node started for it (tests/nemo_rl_real_ray.py),
its GPUs declared to Ray as logical resources: NeMo-RL's actors are Ray's worker processes, each installing the GPU
stand-ins (install_in_ray_worker) before NeMo-RL's code runs there, and NeMo-RL's own init_ray joins the cluster. Those
cases run in a second runner process (`--real-ray`): the first imported NeMo-RL over the in-process Ray. Every other
case runs over the in-process Ray (tests/standin_ray.py), in a fork of the process that imported NeMo-RL once, because
- a real cluster here is one node: the multi-node cases' placement (NeMo-RL's per-node groups, Gym's judge nodes)
  needs the stand-in's logical nodes;
- every actor is a process importing torch, transformers and what of NeMo-RL it runs (seconds of a CPU and 0.5 GB
  each), so a node of 8 GPUs (some 20 actors) would take minutes of this machine's 2 CPUs: the real-Ray cases are
  nodes of 2 GPUs (a minute each);
- what real Ray cannot place it waits on forever, where the stand-in refuses at once with the arithmetic (the
  controls that check NeMo-RL's and Gym's own refusals).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import nemo_rl_real_ray  # noqa: E402
import standin_ray  # noqa: E402
import upstream  # noqa: E402

DRIVERS = {"grpo": "examples/run_grpo.py", "nemo_gym": "examples/nemo_gym/run_grpo_nemo_gym.py"}
# Installed here but for a GPU: replaced by inert modules (so is any module NeMo-RL imports that is not installed:
# Transformer Engine, flash-attn, the loggers' SDKs). torch, transformers, datasets and torchdata are the real ones;
# Ray is the in-process one.
GPU_ONLY = frozenset({"vllm", "megatron", "sglang"})
CONTAINER_ENV = {  # set in NeMo-RL's container image; the Megatron policy refuses to start without the first
    "TORCH_CUDA_ARCH_LIST": "9.0 10.0",
    "NRL_VIRTUAL_CLUSTER_MAX_RETRIES": "1",  # the in-process Ray refuses at once what real Ray would wait on
    "TOKENIZERS_PARALLELISM": "false",  # the cases run in forks
}
REAL_RAY_CASE_SECONDS = 420  # a real-Ray case stuck (Ray waits forever on what it cannot place) fails, never hangs
WORKER_SETUP_HOOK = "nemo_rl_run.install_in_ray_worker"  # importable in Ray's workers: PYTHONPATH holds tests/
WORKER_GPUS = "RLSTEPS_STANDIN_GPUS_PER_NODE"  # torch.cuda's device count in a real Ray worker's process
PRELOADED = ("nemo_rl.algorithms.grpo", "nemo_rl.environments.nemo_gym", "nemo_rl.data.utils",
             "nemo_rl.environments.reward_model_environment", "nemo_rl.environments.math_environment")  # fmt: skip


def for_steps(config: dict, steps: int) -> dict:
    """The config as run here: grpo.max_num_steps cut to `steps`, a checkpoint at each step, and past one step a
    validation at the last where the config validates."""
    config["grpo"]["max_num_steps"] = min(config["grpo"]["max_num_steps"], steps)
    if steps > 1 and config["grpo"].get("val_period"):
        config["grpo"]["val_period"] = steps  # a validation after the last step's refit
    config["checkpointing"]["enabled"] = True
    config["checkpointing"]["save_period"] = 1
    return config


def where(error: BaseException) -> str:
    """The innermost frame in NeMo-RL's or NeMo-Gym's code (or the driver) that the error passed through."""
    frames = traceback.extract_tb(error.__traceback__)
    markers = ("/nemo_rl/", "/nemo_gym/", "/examples/")
    ours = [f for f in frames if any(m in f.filename for m in markers)]
    frame = (ours or frames)[-1]
    marker = next((m for m in markers if m in frame.filename), None)
    name = marker.lstrip("/") + frame.filename.split(marker, 1)[-1] if marker else frame.filename
    return f"{name}:{frame.lineno}"


_IMPORTABLE = contextlib.ExitStack()


def import_nemo_rl(in_process_ray: bool = True, preload: tuple[str, ...] = PRELOADED) -> None:
    """NeMo-RL, NeMo-Gym and the GPU stand-ins, imported once in this process, over the in-process Ray or the real
    one."""
    import nemo_rl_oracle

    sys.path.insert(0, str(upstream.nemo_rl_deps()))  # before anything imports transformers
    nemo_rl_oracle.gym_deps_on_path()
    os.environ.update(CONTAINER_ENV)
    # torch's TensorBoard writer needs the tensorboard package: a logger backend the compiled configs leave off
    sys.modules["torch.utils.tensorboard"] = upstream.inert_module("torch.utils.tensorboard")
    if in_process_ray:
        standin_ray.install(node_count=1, gpus_per_node=1)
    with contextlib.redirect_stdout(io.StringIO()):
        _IMPORTABLE.enter_context(upstream.nemo_rl_importable(stub=GPU_ONLY))  # for the process's life
        import importlib

        import nemo_rl_gpu_standins

        for name in preload:
            importlib.import_module(name)
        nemo_rl_gpu_standins.install()


def install_in_ray_worker() -> None:
    """Ray's worker_process_setup_hook for a real-Ray case: this worker process imports NeMo-RL with the GPU
    stand-ins, and torch.cuda answers as a node of the case's GPUs would."""
    import nemo_rl_gpu_standins

    import_nemo_rl(in_process_ray=False, preload=())
    nemo_rl_gpu_standins.report_gpus(int(os.environ[WORKER_GPUS]))


def run_case(case: dict) -> dict:
    """One case, in this (forked) process: on a real Ray cluster of its own, or the in-process Ray."""
    if case.get("ray") != "real":
        standin_ray.install(node_count=case["nodes"], gpus_per_node=case["gpus_per_node"])
        return run_driver(case)
    assert case["nodes"] == 1, "a real-Ray case runs on one node"
    signal.signal(signal.SIGALRM, _too_long)
    signal.alarm(REAL_RAY_CASE_SECONDS)
    with nemo_rl_real_ray.local_cluster(case["gpus_per_node"]) as address:
        paths = [str(HERE), os.environ.get("PYTHONPATH")]  # the setup hook's module, in Ray's worker processes
        os.environ.update(RAY_ADDRESS=address, PYTHONPATH=os.pathsep.join(filter(None, paths)))
        os.environ[WORKER_GPUS] = str(case["gpus_per_node"])
        nemo_rl_real_ray.joined_with_setup_hook(WORKER_SETUP_HOOK)
        try:
            return run_driver(case)
        finally:
            import ray

            ray.shutdown()
            signal.alarm(0)


def _too_long(signum, frame):
    raise TimeoutError(f"the case ran past {REAL_RAY_CASE_SECONDS} s on real Ray")


def run_driver(case: dict) -> dict:
    """The case's driver script run as the job runs it; its outcome, with the placement groups Ray was asked for."""
    import nemo_rl_gpu_standins

    nemo_rl_gpu_standins.report_gpus(case["gpus_per_node"])
    config_path = Path(case["config"])
    config = for_steps(yaml.safe_load(config_path.read_text()), case.get("steps", 1))
    run_config = config_path.with_name(config_path.stem + ".run.yaml")
    run_config.write_text(yaml.safe_dump(config))
    script = upstream.unpacked("nemo_rl") / DRIVERS[case["driver"]]
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            sys.argv = [str(script), "--config", str(run_config)]
            runpy.run_path(str(script), run_name="__main__")
    except BaseException as error:  # NeMo-RL's asserts, ValueErrors and the like: where it stopped, and why
        message = " ".join(str(error).split())[:2000] or type(error).__name__
        return {"ok": False, "error": f"{type(error).__name__}: {message}", "where": where(error),
                "log": log.getvalue(), "traceback": traceback.format_exc()[-8000:],
                **ray_record()}  # fmt: skip
    checkpoints = Path(config["checkpointing"]["checkpoint_dir"])
    done = sorted(checkpoints.glob("step_*/training_info.json"))
    info = json.loads(done[-1].read_text()) if done else {}
    return {"ok": True, "steps": info.get("total_steps", 0), "checkpoint": str(done[-1].parent) if done else None,
            "log": log.getvalue(), **ray_record()}  # fmt: skip


def ray_record() -> dict:
    """What the run asked of Ray: the placement groups, and (on a real Ray) its actors' processes; nothing where the
    driver never joined a real Ray."""
    import ray

    if not (standin_ray.in_process() or ray.is_initialized()):
        return {}
    return {"placements": nemo_rl_real_ray.placement_groups(), "actors": nemo_rl_real_ray.actor_processes(),
            "driver_pid": os.getpid()}  # fmt: skip


def run_in_fork(case: dict, result: Path) -> dict:
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            outcome = run_case(case)
        except BaseException as error:  # the harness itself failed: say so, never hang the parent
            outcome = {"ok": False, "error": f"harness: {type(error).__name__}: {error}", "where": where(error),
                       "traceback": traceback.format_exc()[-8000:]}  # fmt: skip
        result.write_text(json.dumps(outcome))
        os._exit(0)  # NeMo-RL's finalisers would call into the stand-ins at teardown
    _, status = os.waitpid(pid, 0)
    if not result.is_file():
        return {"ok": False, "error": f"harness: the case's process ended with status {status} and no result"}
    return {**json.loads(result.read_text()), "seconds": round(time.monotonic() - started, 1)}


def run_cases(cases: list[dict], result: Path) -> dict:
    results = {}
    for number, case in enumerate(cases):
        results[case["name"]] = run_in_fork(case, result.with_name(f"{result.stem}.{number}.json"))
    return results


def start_real_ray_runner(cases: list[dict], result: Path) -> subprocess.Popen | None:
    """The real-Ray cases in a runner process of their own (NeMo-RL imported over the real Ray), started now to run
    beside this one's; None without such cases."""
    if not cases:
        return None
    listing = result.with_name(f"{result.stem}.real_ray_cases.json")
    listing.write_text(json.dumps(cases))
    return subprocess.Popen([sys.executable, __file__, str(listing), "--result", str(_real_ray_result(result)),
                             "--real-ray"])  # fmt: skip


def _real_ray_result(result: Path) -> Path:
    return result.with_name(f"{result.stem}.real_ray.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", type=Path)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--real-ray", action="store_true", help="run every case on a real Ray cluster of its own")
    args = parser.parse_args(argv)
    cases = json.loads(args.cases.read_text())
    real = [case for case in cases if case.get("ray") == "real" and not args.real_ray]
    runner = start_real_ray_runner(real, args.result)
    import_nemo_rl(in_process_ray=not args.real_ray)
    gc.freeze()  # what is imported is never garbage: each fork's collections skip it
    results = run_cases([case for case in cases if case not in real], args.result)
    if runner is not None:
        runner.wait()
        outcome = _real_ray_result(args.result)
        results.update(json.loads(outcome.read_text()) if outcome.is_file() else {
            case["name"]: {"ok": False, "error": f"harness: the real-Ray runner ended with {runner.returncode}"}
            for case in real})  # fmt: skip
    args.result.write_text(json.dumps(results))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
