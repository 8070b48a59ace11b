"""Runs NeMo-RL's own GRPO driver on master configs, on a CPU: its config handling, grpo.setup and GRPO steps, with
only the GPU work stood in (tests/standin_ray.py for Ray's processes and GPU bundles, tests/nemo_rl_gpu_standins.py
for vLLM's engine, the policy workers' forward and backward, and NeMo-Gym's server processes).

    python tests/nemo_rl_run.py CASES.json --result OUT.json

CASES.json is a list of {"name", "config" (a master config YAML), "driver" (grpo | nemo_gym), "nodes",
"gpus_per_node" (the job's Ray cluster), "steps"}. The config's files (policy.model_name, data.*.data_path) must
exist: the job's prepare stage writes them. Each case is the driver's `main()` as the job starts it (`python
examples/...py --config CONFIG`), with grpo.max_num_steps cut to `steps` and a checkpoint saved at each step, so that
the data path, the loss, the checkpoint manager and the logger all run. NeMo-RL is imported once; each case runs in
a fork of that process, so no state passes between cases. OUT.json gets {name: {"ok": true, "steps": N,
"checkpoint": ...} or {"ok": false, "error": "...", "where": "nemo_rl/...py:LINE"}} (where NeMo-RL's code stopped),
each with the run's printed log and its wall time. Run it as a process of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
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


def import_nemo_rl() -> None:
    """NeMo-RL, NeMo-Gym and the stand-ins, imported once in the parent process."""
    import nemo_rl_oracle

    sys.path.insert(0, str(upstream.nemo_rl_deps()))  # before anything imports transformers
    nemo_rl_oracle.gym_deps_on_path()
    os.environ.update(CONTAINER_ENV)
    # torch's TensorBoard writer needs the tensorboard package: a logger backend the compiled configs leave off
    sys.modules["torch.utils.tensorboard"] = upstream.inert_module("torch.utils.tensorboard")
    standin_ray.install(node_count=1, gpus_per_node=1)
    with contextlib.redirect_stdout(io.StringIO()):
        _IMPORTABLE.enter_context(upstream.nemo_rl_importable(stub=GPU_ONLY))  # for the process's life
        import importlib

        import nemo_rl_gpu_standins

        for name in PRELOADED:
            importlib.import_module(name)
        nemo_rl_gpu_standins.install()


def run_case(case: dict) -> dict:
    """One case, in this (forked) process."""
    import nemo_rl_gpu_standins

    standin_ray.install(node_count=case["nodes"], gpus_per_node=case["gpus_per_node"])
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
                "log": log.getvalue(), "traceback": traceback.format_exc()[-8000:]}  # fmt: skip
    checkpoints = Path(config["checkpointing"]["checkpoint_dir"])
    done = sorted(checkpoints.glob("step_*/training_info.json"))
    info = json.loads(done[-1].read_text()) if done else {}
    return {"ok": True, "steps": info.get("total_steps", 0), "checkpoint": str(done[-1].parent) if done else None,
            "log": log.getvalue()}  # fmt: skip


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", type=Path)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    cases = json.loads(args.cases.read_text())
    import_nemo_rl()
    gc.freeze()  # what is imported is never garbage: each fork's collections skip it
    results = {}
    for number, case in enumerate(cases):
        results[case["name"]] = run_in_fork(case, args.result.with_name(f"{args.result.stem}.{number}.json"))
    args.result.write_text(json.dumps(results))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
