"""The GPU paths CI (CPU only) never runs, in one command: one table, a non-zero exit on any failure.

    bash benchmarks/gpu_check.sh                      # on a machine with one or more NVIDIA GPUs: under 10 minutes
    bash benchmarks/gpu_check.sh --only "rl/rs" decode  # the rows whose names contain any of these
    bash benchmarks/gpu_check.sh --cpu-smoke          # the same harness on a CPU: the rows a CPU can run, few steps

Every row runs as subprocesses with a timeout (a crash or a hang fails that row, the table goes on); the driver
itself imports no torch and nothing of rlsteps (it reads a run's metrics through the rows' own interpreter), so it runs
the same from a bare GPU machine's python as from the repository's venv. Rows (benchmarks/README.md describes each):

    tiny rl/{rs,reinforce,rlhf} {fp32,bf16}  `rlsteps run rl/<step> -c tiny run.device=cuda [run.dtype=bfloat16]`:
                                   exit 0, the output policy written, val/true_reward higher at the end
    fsdp2 two processes (nccl)     the tiny rl/rs step under torchrun (a local profile, nprocs_per_node 2), one GPU a
                                   process: exit 0, process 1 on cuda:1, the reward rose; skipped below 2 GPUs
    compiled decode (CUDA graphs)  bench_generate.py, the tiny preset in fp32: the built-in sampler's decode step
                                   compiled (its CUDA default, mode reduce-overhead) against HF generate, greedy tokens
    vllm rollouts (sync, sleep)    the tiny rl/rs step with rollout.backend=vllm: exit 0, a weight sync every step,
                                   the sampler agreeing with the trainer, vLLM falling asleep and waking
    megatron GPTModel              python -m rlsteps.engine.megatron.gpt_model on the tiny Megatron policy, fp32 and
                                   bf16: megatron-core's GPTModel gives the engine's logits
    grpo 0.37b step                a random 0.37B Qwen2 (bench_train.py's shape) as the policy of the tiny rl/rlhf
                                   step (GRPO) in bf16: phase times from the run's own timers, its MFU and decode
                                   tokens/s
    grpo 0.37b 32x8x128 [compiled] the same at 32 prompts x 8 rollouts x 128 new tokens, KL 0; eager and compiled
    trl grpo 0.37b 32x8x128        benchmarks/trl_step.py: TRL's GRPOTrainer on the same policy at the same shape
    train phase 0.37b              bench_train.py --size 0.37b, bf16 (autocast), 64 rows x (512 + 512), eager and
                                   compiled (train.compile=true): MFU
    lora train phase 0.37b         bench_train.py --lora --reference: full fine-tuning and LoRA with the reference's
                                   pass, bf16: step time and peak memory of each
    packed train phase 0.37b       bench_train.py --varied-lengths --sequence-packing, bf16, 256 rows of 64 + 1-128
                                   tokens: padded rows against packed ones (train.sequence_packing)
    decode 0.37b vs hf.generate    bench_generate.py on the 0.37B shape, bf16, sampling: tokens/s against HF generate

Targets on one H100 or H200 (judged only where the device's name says so, unless --no-targets): the GRPO step's
median <= 1.0 s at 32x8x128 and <= 0.5 s at the tiny shape, the train phase >= 30% MFU, decode >= 5x HF generate.
Without a CUDA device (and without --cpu-smoke) it says so and runs nothing (exit 0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
NO_CUDA = "no CUDA device: nothing to check"
TWO_PROCESSES = "profiles:\n  two:\n    executor: local\n    nprocs_per_node: 2\n"
RUNNING: set[subprocess.Popen] = set()  # the rows' subprocesses now running
TARGETS = {"step_s": {"wide": 1.0, "tiny": 0.5}, "mfu": 0.30, "decode_vs_hf": 5.0}  # on one H100 or H200


class Failed(Exception):
    """The row failed; the message says why."""


class Skipped(Exception):
    """The row cannot run here; the message says why."""


@dataclass
class Context:
    work: Path  # scratch folder: one sub-folder per row, the logs of every subprocess
    device: str  # cuda, or cpu under --cpu-smoke
    gpus: int
    device_name: str
    smoke_steps: int  # --cpu-smoke: train.max_steps of the tiny runs
    timeout: float  # seconds per subprocess
    targets: bool  # judge the targets (on an H100 or H200)
    env: dict[str, str] = field(default_factory=dict)
    tiny_world: dict[str, str] = field(default_factory=dict)  # TinyWorld's paths, built once before any row

    @property
    def smoke(self) -> bool:
        return self.device == "cpu"

    @property
    def judge_targets(self) -> bool:
        return self.targets and any(name in self.device_name for name in ("H100", "H200"))


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Context], str]  # the figures, or raises Failed / Skipped
    cuda_only: str | None = None  # why it needs CUDA; None: it runs under --cpu-smoke as well
    alone: bool = False  # runs by itself after the others (timings, or vLLM's memory profiling)


@dataclass
class Result:
    check: str
    status: str  # ok, FAILED, skipped
    seconds: float
    figures: str


# ---------------------------------------------------------------------------------------------
# subprocesses


def call(ctx: Context, name: str, argv: list[str], cwd: Path, env: dict[str, str] | None = None):
    """argv in cwd with the run's environment; its output kept under work/logs. Failed on a timeout, after the
    process and everything it started (a run's worker in a session of its own, torchrun's processes) are ended."""
    logs = ctx.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**ctx.env, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    RUNNING.add(process)
    try:
        stdout, stderr = process.communicate(timeout=ctx.timeout)
    except subprocess.TimeoutExpired:
        end_tree(process)
        stdout, stderr = process.communicate()
        (logs / f"{slug}.out").write_text(stdout)
        (logs / f"{slug}.err").write_text(stderr)
        raise Failed(f"timed out after {ctx.timeout:.0f} s: {' '.join(argv[:6])} ...") from None
    finally:
        RUNNING.discard(process)
    (logs / f"{slug}.out").write_text(stdout)
    (logs / f"{slug}.err").write_text(stderr)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def end_all() -> None:
    """End every row's subprocess still running (an interrupted check: they run in sessions of their own, so a
    Ctrl-C reaches none of them)."""
    for process in list(RUNNING):
        end_tree(process, grace=5.0)


def end_tree(process: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM to the process's group (a run stops its worker on it), then SIGKILL to whatever of its tree is left."""
    tree = [process.pid, *descendants(process.pid)]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    for pid in [*tree, *descendants(process.pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def descendants(root: int) -> list[int]:
    """The pids under `root`, from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found += children
        frontier += children
    return found


def expect_success(done: subprocess.CompletedProcess, what: str) -> None:
    if done.returncode != 0:
        raise Failed(f"{what} exited {done.returncode}: {last_line(done.stderr or done.stdout)}")


def last_line(text: str) -> str:
    """The last line that says something (a traceback's error line, typically)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def rlsteps(ctx: Context, name: str, cwd: Path, *argv: str, python: str = sys.executable, env=None):
    cwd.mkdir(parents=True, exist_ok=True)
    return call(ctx, name, [python, "-m", "rlsteps.cli", *argv], cwd, env)


def run_folder(cwd: Path, step: str) -> Path:
    return cwd / ".rlsteps" / "runs" / f"{step.replace('/', '_')}-tiny"


SERIES = (
    "import json, sys; from rlsteps.contract.run_files import read_metrics; "
    "from rlsteps.engine.records.metrics import metric_series; "
    "print(json.dumps(metric_series(read_metrics(sys.argv[1]), sys.argv[2])[1]))"
)


def series(ctx: Context, run: Path, key: str) -> list[float]:
    """A metric of a run, read by the rlsteps the rows run (their interpreter and environment): the driver itself
    needs nothing of rlsteps, so it judges the same from a bare GPU machine as from the repository's venv."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    done = subprocess.run([sys.executable, "-c", SERIES, str(path), key], env=ctx.env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    expect_success(done, f"reading {key} from {path}")
    return json.loads(done.stdout)


def smoke_options(ctx: Context) -> list[str]:
    """On a CPU: few steps, one validation at the end, one torch thread (a shared machine)."""
    if not ctx.smoke:
        return []
    steps = ctx.smoke_steps
    return [f"train.max_steps={steps}", f"validation.interval={steps}", "checkpoint.interval=0", "run.num_threads=1"]


def judge_tiny_run(ctx: Context, done: subprocess.CompletedProcess, run: Path) -> list[str]:
    """Exit 0, the output policy written, the true reward higher at the end (not judged over a smoke run's few
    steps). Returns the figures."""
    expect_success(done, "the run")
    if not (run / "policy" / "rlsteps_artifact.json").is_file():
        raise Failed(f"no output policy at {run / 'policy'}")
    true = series(ctx, run, "val/true_reward")
    if len(true) < 2:
        raise Failed(f"val/true_reward logged {len(true)} times: no trend to judge")
    steps = len(series(ctx, run, "timers/step"))
    figures = [f"{steps} steps", f"true reward {true[0]:.2f} -> {true[-1]:.2f}"]
    if not ctx.smoke and true[-1] <= true[0]:
        raise Failed(f"the true reward did not rise: {true[0]:.2f} -> {true[-1]:.2f}")
    step_s = series(ctx, run, "timers/step")[1:]
    if step_s:
        figures.append(f"step {statistics.median(step_s):.2f} s")
    return figures


# ---------------------------------------------------------------------------------------------
# the rows


BESIDE = ("rollout.max_age_steps=1", "train.truncated_importance_sampling=true")  # rollouts a step ahead


def tiny_step(step: str, dtype: str, extra: tuple[str, ...] = (), slug: str = "") -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        cwd = ctx.work / f"{step.replace('/', '_')}-{dtype}{slug}"
        precision = ["run.dtype=bfloat16"] if dtype == "bf16" else []
        done = rlsteps(ctx, cwd.name, cwd, "run", step, "-c", "tiny", f"run.device={ctx.device}", *precision,
                       *extra, *smoke_options(ctx))  # fmt: skip
        return ", ".join(judge_tiny_run(ctx, done, run_folder(cwd, step)))

    return run


def fsdp2_two_processes(ctx: Context) -> str:
    if ctx.gpus < 2:
        raise Skipped(f"needs 2 GPUs ({ctx.gpus} visible)")
    cwd = ctx.work / "fsdp2"
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "rlsteps.yaml").write_text(TWO_PROCESSES)
    done = rlsteps(ctx, "fsdp2", cwd, "run", "rl/rs", "-c", "tiny", "-r", "two", "run.device=cuda",
                   "train.micro_batch_size=8")  # fmt: skip
    run = run_folder(cwd, "rl/rs")
    figures = judge_tiny_run(ctx, done, run)
    rank1 = run / "train.rank1.log"
    said = rank1.read_text() if rank1.is_file() else ""
    if "process 1 of 2 on cuda:1" not in said:
        raise Failed(f"train.rank1.log does not say 'process 1 of 2 on cuda:1' ({rank1})")
    return ", ".join(["nccl, 2 processes", *figures])


def compiled_decode(ctx: Context) -> str:
    """bench_generate.py's tiny preset on the GPU: its built-in sampler is the compiled decode step there."""
    argv = [sys.executable, str(BENCHMARKS / "bench_generate.py"), "--preset", "tiny", "--device", "cuda",
            "--dtype", "float32", "--settings", "greedy", "sampling", "--repeats", "3"]  # fmt: skip
    done = call(ctx, "compiled_decode", argv, REPO)
    expect_success(done, "bench_generate.py")
    ratios = generate_ratios(done.stdout)
    same = re.search(r"greedy tokens as hf: builtin (\d+)%", done.stdout)
    if not same or not ratios.get("greedy"):
        raise Failed(f"bench_generate.py printed no greedy line: {last_line(done.stdout)}")
    share = int(same.group(1))
    figures = f"greedy {ratios['greedy']:.2f}x hf, sampling {ratios.get('sampling', float('nan')):.2f}x hf, "
    figures += f"greedy tokens as hf {share}%"
    if share < 90:  # a wrong cache or position would part the tokens at once; rounding flips a token late, if at all
        raise Failed(figures)
    return figures


def generate_ratios(stdout: str) -> dict[str, float]:
    """setting -> builtin/hf from bench_generate.py's lines."""
    found = re.findall(r"^(\w+)\s.*?builtin/hf=([\d.]+)", stdout, flags=re.MULTILINE)
    return {setting: float(ratio) for setting, ratio in found}


VLLM_PROBE = (
    "import vllm, rlsteps.engine.run.loop; from vllm.platforms import current_platform as p; print(p.device_type)"
)


def vllm_python(ctx: Context) -> str:
    """An interpreter whose vLLM runs on CUDA: $RLSTEPS_VLLM_PYTHON, the repository's .venv-vllm, then this one.
    Skipped when none imports vllm (or only a CPU build does: tests/make_vllm_env.sh installs that one)."""
    candidates = [os.environ.get("RLSTEPS_VLLM_PYTHON"), str(REPO / ".venv-vllm" / "bin" / "python"), sys.executable]
    builds = []
    for python in dict.fromkeys(c for c in candidates if c and Path(c).is_file()):
        probe = call(ctx, "vllm_probe", [python, "-c", VLLM_PROBE], ctx.work)
        platform = probe.stdout.strip().splitlines()[-1:] if probe.returncode == 0 else []
        if platform == ["cuda"]:
            return python
        if platform:
            builds.append(f"{python}: {platform[0]}")
    if builds:
        raise Skipped(f"vllm: no CUDA build installed ({'; '.join(builds)})")
    raise Skipped("vllm: not installed")


def vllm_rollouts(ctx: Context) -> str:
    python = vllm_python(ctx)
    cwd = ctx.work / "vllm"
    # INFO: vLLM says when it falls asleep and wakes up (the engine sets WARNING unless told)
    done = rlsteps(ctx, "vllm", cwd, "run", "rl/rs", "-c", "tiny", "run.device=cuda", "rollout.backend=vllm",
                   python=python, env={"VLLM_LOGGING_LEVEL": "INFO"})  # fmt: skip
    run = run_folder(cwd, "rl/rs")
    figures = judge_tiny_run(ctx, done, run)
    if "rollouts: vLLM in process" not in done.stderr:
        raise Failed("the run did not sample with vLLM (no 'rollouts: vLLM in process' line)")
    steps, syncs = len(series(ctx, run, "timers/step")), len(series(ctx, run, "timers/weight_sync"))
    agreement = series(ctx, run, "train/token_mult_prob_error")
    log = done.stdout + done.stderr + "".join(path.read_text(errors="replace") for path in cwd.rglob("*.log"))
    sleeps, wakes = log.count("to fall asleep"), log.count("to wake up")
    figures += [f"{syncs} syncs", f"{sleeps} sleeps / {wakes} wakes"]
    if agreement:
        figures.append(f"sampler/trainer prob error <= {max(agreement):.4f}")
    if syncs != steps:
        raise Failed(f"{syncs} weight syncs in {steps} steps: " + ", ".join(figures))
    if not agreement or max(agreement) > 1.02:  # vLLM's kernels against the trainer's, both fp32: close to 1
        raise Failed("the sampler and the trainer disagree: " + ", ".join(figures))
    if sleeps == 0 or wakes == 0:
        raise Failed("vLLM never slept or never woke: " + ", ".join(figures))
    return ", ".join(figures)


def megatron_gpt_model(ctx: Context) -> str:
    figures = []
    for dtype in ["float32"] if ctx.smoke else ["float32", "bfloat16"]:
        argv = [sys.executable, "-m", "rlsteps.engine.megatron.gpt_model", ctx.tiny_world["policy_megatron"],
                "--device", ctx.device, "--dtype", dtype]  # fmt: skip
        done = call(ctx, f"megatron_{dtype}", argv, ctx.work)
        if "No module named 'megatron" in done.stderr:
            raise Skipped("megatron-core not installed")
        expect_success(done, f"gpt_model --dtype {dtype}")
        report = json.loads(done.stdout[done.stdout.index("{") :])
        relative = report["max_abs_diff"] / max(report["logit_scale"], 1e-6)
        figures.append(f"{dtype} max |diff| {report['max_abs_diff']:.2g} ({relative:.1e} of the logits), "
                       f"argmax {report['same_argmax']:.0%}")  # fmt: skip
        worst, argmax = (1e-4, 1.0) if dtype == "float32" else (5e-2, 0.8)  # bf16: two orders of rounding
        if relative > worst or report["same_argmax"] < argmax:
            raise Failed("; ".join(figures))
    return "; ".join(figures)


def make_policy(out: Path, size: str, tokenizer_dir: str) -> None:
    """A random Qwen2 of bench_train.py's `size` with the tiny world's tokenizer, as a Hugging Face folder (fp32)."""
    sys.path.insert(0, str(BENCHMARKS))
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from bench_train import SIZES

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape = SIZES[size]
    config = Qwen2Config(
        hidden_size=shape["hidden"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], intermediate_size=shape["intermediate"],
        vocab_size=max(shape["vocab"], len(tokenizer)), tie_word_embeddings=shape["tied"],
        max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    import torch

    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


# The issue-sized GRPO step: 32 prompts x 8 rollouts x up to 128 new tokens, one optimizer step of the 256 rows in
# micro-batches of 64, no KL (no reference policy); the same on both sides of the rlsteps-against-TRL rows.
WIDE = {"prompts": 32, "group": 8, "new_tokens": 128, "micro_batch": 64}


def wide_options() -> list[str]:
    rows = WIDE["prompts"] * WIDE["group"]
    return [f"rollout.prompts_per_step={WIDE['prompts']}", f"rollout.num_rollouts_per_prompt={WIDE['group']}",
            f"rollout.sampling.max_new_tokens={WIDE['new_tokens']}", f"rollout.generation_batch_size={rows}",
            f"rollout.logprob_micro_batch_size={WIDE['micro_batch']}", f"train.global_batch_size={rows}",
            f"train.micro_batch_size={WIDE['micro_batch']}", "grpo.kl_beta=0.0"]  # fmt: skip


def policy_0_37b(ctx: Context) -> tuple[Path, str]:
    """The random policy the GRPO rows share (made once), and its size's name: 0.37B, or tiny on a CPU."""
    size = "tiny" if ctx.smoke else "0.37b"
    policy = ctx.work / f"policy-{size}"
    if not (policy / "config.json").is_file():
        argv = [sys.executable, __file__, "make-policy", str(policy), size, ctx.tiny_world["policy"]]
        expect_success(call(ctx, "grpo_make_policy", argv, REPO), "making the random policy")
    return policy, size


def grpo_step(shape: str, compiled: bool = False) -> Callable[[Context], str]:
    """The tiny rl/rlhf step (GRPO) with a random 0.37B policy in bf16, at the tiny config's shape or WIDE's, eager or
    with `train.compile=true`; on a CPU the tiny policy in fp32, a step or two."""

    def run(ctx: Context) -> str:
        policy, size = policy_0_37b(ctx)
        cwd = ctx.work / f"grpo-{shape}{'-compiled' if compiled else ''}"
        options = [f"inputs.policy={policy}", f"run.device={ctx.device}", "validation.interval=0",
                   "checkpoint.interval=0"]  # fmt: skip
        options += wide_options() if shape == "wide" else []
        options += ["train.compile=true"] if compiled else []
        if ctx.smoke:
            options += [f"train.max_steps={ctx.smoke_steps}", "run.num_threads=1"]
        else:
            options += ["run.dtype=bfloat16", "train.max_steps=6"]
        done = rlsteps(ctx, cwd.name, cwd, "run", "rl/rlhf", "-c", "tiny", *options)
        expect_success(done, "the run")
        run_dir = run_folder(cwd, "rl/rlhf")
        if not (run_dir / "policy" / "rlsteps_artifact.json").is_file():
            raise Failed(f"no output policy at {run_dir / 'policy'}")
        return grpo_figures(ctx, run_dir, size, TARGETS["step_s"][shape])

    return run


def grpo_figures(ctx: Context, run: Path, size: str, target_s: float) -> str:
    """The median step (the first left out: it compiles and warms up) and its phases, the first step, MFU, decode."""

    def median(key: str) -> float | None:
        values = series(ctx, run, key)
        values = values[1:] or values
        return statistics.median(values) if values else None

    phases = {name: median(f"timers/{name}") for name in ("step", "rollout", "reward", "prepare", "train")}
    if phases["step"] is None:
        raise Failed("the run logged no timers/step")
    first = series(ctx, run, "timers/step")[0]
    figures = [f"{size}, median step {phases['step']:.2f} s ("]
    figures[0] += " ".join(f"{name} {s:.2f}" for name, s in phases.items() if name != "step" and s is not None) + ")"
    figures.append(f"first step {first:.1f} s")
    used, rate = median("perf/train_mfu"), median("perf/generation_tokens_per_s")
    figures.append(f"train MFU {used:.1%}" if used is not None else "train MFU n/a")
    if rate is not None:
        figures.append(f"decode {rate:.0f} tok/s")
    if ctx.judge_targets and phases["step"] > target_s:
        raise Failed(f"target: step <= {target_s} s; " + ", ".join(figures))
    return ", ".join(figures)


def trl_grpo_step(ctx: Context) -> str:
    """benchmarks/trl_step.py: TRL's GRPOTrainer on the same policy at WIDE's shape (a CPU: 1 step, tiny shape)."""
    policy, size = policy_0_37b(ctx)
    shape = {"prompts": 4, "group": 4, "new_tokens": 8, "micro_batch": 16} if ctx.smoke else WIDE
    argv = [sys.executable, str(BENCHMARKS / "trl_step.py"), str(policy), "--reward-model",
            ctx.tiny_world["reward_model"], "--prompts", ctx.tiny_world["train_prompts"], "--out",
            str(ctx.work / "trl-grpo"), "--steps", "1" if ctx.smoke else "6", "--device", ctx.device,
            "--prompts-per-step", str(shape["prompts"]), "--group", str(shape["group"]), "--new-tokens",
            str(shape["new_tokens"]), "--micro-batch", str(shape["micro_batch"])]  # fmt: skip
    done = call(ctx, "trl_grpo", argv, REPO)
    if done.returncode == 3 and "trl: not installed" in done.stderr:
        raise Skipped("trl: not installed (pip install trl==1.16.0)")
    expect_success(done, "trl_step.py")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    steps = report["step_seconds"]
    later = steps[1:] or steps
    figures = [f"{size}, median step {statistics.median(later):.2f} s", f"first step {steps[0]:.1f} s"]
    if report.get("peak_gb") is not None:
        figures.append(f"peak {report['peak_gb']:.1f} GB")
    figures.append(f"activation checkpointing {'on' if report['gradient_checkpointing'] else 'off'}")
    return ", ".join(figures)


def train_phase(ctx: Context) -> str:
    """bench_train.py: the 0.37B train phase in bf16 (fp32 master weights, autocast) on the GPU, eager and compiled
    (train.compile=true); the target is judged on the compiled one. Tiny and eager on a CPU."""
    shape = ["--size", "0.37b", "--dtype", "bfloat16", "--rows", "64", "--prompt-len", "512", "--response-len", "512",
             "--micro-batch", "16", "--steps", "4", "--warmup", "2", "--compile"]  # fmt: skip
    if ctx.smoke:
        shape = ["--size", "tiny", "--steps", "1", "--warmup", "0"]
    rows, figures = bench_train_rows(ctx, "train_phase", shape)
    judged = rows[-1][4]  # the compiled configuration where it ran
    if ctx.judge_targets and (judged == "n/a" or float(judged.rstrip("%")) < 100 * TARGETS["mfu"]):
        raise Failed(f"target: MFU >= {TARGETS['mfu']:.0%}; " + "; ".join(figures))
    return "; ".join(figures)


def lora_train_phase(ctx: Context) -> str:
    """bench_train.py --lora --reference: the 0.37B train phase in bf16 with the reference's pass a step makes,
    full fine-tuning (a reference copy) against LoRA rank 8 (the reference is the base): step time and peak memory.
    The tiny shape, fp32, on a CPU."""
    shape = ["--size", "0.37b", "--dtype", "bfloat16", "--rows", "64", "--prompt-len", "512", "--response-len", "512",
             "--micro-batch", "16", "--steps", "3", "--warmup", "1", "--lora", "--reference"]  # fmt: skip
    if ctx.smoke:
        shape = ["--size", "tiny", "--steps", "1", "--warmup", "0", "--lora", "--reference"]
    rows, figures = bench_train_rows(ctx, "lora_train_phase", shape)
    if len(rows) != 2:
        raise Failed(f"bench_train.py printed {len(rows)} rows, not full fine-tuning and LoRA: " + "; ".join(figures))
    (_, full_s, *_, full_gb), (_, lora_s, *_, lora_gb) = rows
    ratios = f"LoRA {float(full_s) / float(lora_s):.2f}x the speed, {float(lora_gb) / float(full_gb):.2f}x the memory"
    return "; ".join([*figures, ratios])


def packed_train_phase(ctx: Context) -> str:
    """bench_train.py --varied-lengths --sequence-packing: the 0.37B train phase in bf16 on rows of a GRPO step's
    lengths (64 + 1-128 tokens: the 32x8x128 step's 256 rows), padded rows against packed ones (train.sequence_packing):
    step time of each and the ratio. The tiny shape, fp32, on a CPU."""
    shape = ["--size", "0.37b", "--dtype", "bfloat16", "--rows", "256", "--prompt-len", "64", "--response-len", "128",
             "--micro-batch", "16", "--steps", "3", "--warmup", "1", "--varied-lengths",
             "--sequence-packing"]  # fmt: skip
    if ctx.smoke:
        shape = ["--size", "tiny", "--steps", "1", "--warmup", "0", "--varied-lengths", "--sequence-packing"]
    rows, figures = bench_train_rows(ctx, "packed_train_phase", shape)
    if len(rows) != 2:
        raise Failed(f"bench_train.py printed {len(rows)} rows, not padded and packed: " + "; ".join(figures))
    (_, padded_s, *_), (_, packed_s, *_) = rows
    return "; ".join([*figures, f"packed {float(padded_s) / float(packed_s):.2f}x the padded rows' speed"])


def bench_train_rows(ctx: Context, name: str, shape: list[str]) -> tuple[list[tuple[str, ...]], list[str]]:
    """bench_train.py's table: (configuration, step s, tokens/s, FLOPs, MFU, peak GB) rows, and their figures."""
    argv = [sys.executable, str(BENCHMARKS / "bench_train.py"), "--device", ctx.device, *shape]
    done = call(ctx, name, argv, REPO)
    expect_success(done, "bench_train.py")
    rows = re.findall(r"^((?:float32|autocast-bf16)(?: \+ (?:compile|lora|packed))?)\s+([\d.]+) \(.*?\)\s+(\d+)\s+"
                      r"([\d.e+-]+)\s+(\S+)\s+([\d.]+)", done.stdout, flags=re.MULTILINE)  # fmt: skip
    if not rows:
        raise Failed(f"bench_train.py printed no row: {last_line(done.stdout)}")
    figures = [f"{config}: step {float(step_s):.3f} s, {int(tokens)} tok/s, MFU {share}, peak {float(peak):.1f} GB"
               for config, step_s, tokens, _, share, peak in rows]  # fmt: skip
    return rows, figures


def decode_vs_hf(ctx: Context) -> str:
    """bench_generate.py on bench_train.py's 0.37B shape in bf16; the tiny preset on a CPU."""
    shape = ["--hidden", "1024", "--layers", "24", "--heads", "16", "--intermediate", "2816", "--vocab", "32768",
             "--batch", "64", "--min-prompt", "16", "--max-prompt", "64", "--max-new-tokens", "128",
             "--dtype", "bfloat16", "--repeats", "3"]  # fmt: skip
    if ctx.smoke:
        shape = ["--preset", "tiny", "--repeats", "1", "--batch", "16"]
    argv = [sys.executable, str(BENCHMARKS / "bench_generate.py"), "--device", ctx.device, "--settings", "sampling"]
    done = call(ctx, "decode_vs_hf", [*argv, *shape], REPO)
    expect_success(done, "bench_generate.py")
    rates = re.search(r"builtin [\d.]+s \((\d+) tok/s\)\s+hf\.generate [\d.]+s \((\d+) tok/s\)", done.stdout)
    ratio = generate_ratios(done.stdout).get("sampling")
    if rates is None or ratio is None:
        raise Failed(f"bench_generate.py printed no sampling line: {last_line(done.stdout)}")
    figures = f"builtin {rates.group(1)} tok/s, hf.generate {rates.group(2)} tok/s: {ratio:.2f}x"
    if ctx.judge_targets and ratio < TARGETS["decode_vs_hf"]:
        raise Failed(f"target: >= {TARGETS['decode_vs_hf']:.0f}x hf.generate; {figures}")
    return figures


CHECKS = [
    *(Check(f"tiny {step} {dtype}", tiny_step(step, dtype), cuda_only="bf16 on a CPU is emulated" if dtype == "bf16"
            else None) for step in ("rl/rs", "rl/reinforce", "rl/rlhf") for dtype in ("fp32", "bf16")),
    # against the fp32 rl/reinforce row's step: the rollout process on the second GPU where there is one
    Check("tiny rl/reinforce fp32, rollouts beside training", tiny_step("rl/reinforce", "fp32", BESIDE, "-beside")),
    Check("fsdp2 two processes (nccl)", fsdp2_two_processes, cuda_only="NCCL needs GPUs"),
    Check("compiled decode (CUDA graphs)", compiled_decode, cuda_only="CUDA graphs need a GPU"),
    Check("megatron GPTModel", megatron_gpt_model),
    Check("vllm rollouts (sync, sleep)", vllm_rollouts, cuda_only="vLLM's sleep mode needs a GPU", alone=True),
    Check("grpo 0.37b 32x8x128", grpo_step("wide"), alone=True),
    Check("trl grpo 0.37b 32x8x128", trl_grpo_step, alone=True),
    Check("grpo 0.37b step", grpo_step("tiny"), alone=True),
    Check("grpo 0.37b 32x8x128 compiled", grpo_step("wide", compiled=True), cuda_only="compiles for minutes on a CPU",
          alone=True),
    Check("train phase 0.37b", train_phase, alone=True),
    Check("lora train phase 0.37b", lora_train_phase, alone=True),
    Check("packed train phase 0.37b", packed_train_phase, alone=True),
    Check("decode 0.37b vs hf.generate", decode_vs_hf, alone=True),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# the harness


def run_check(check: Check, ctx: Context, selected: bool) -> Result:
    if ctx.smoke and check.cuda_only:
        return Result(check.name, "skipped", 0.0, f"needs CUDA: {check.cuda_only}")
    if not selected:
        return Result(check.name, "skipped", 0.0, "not selected (--only)")
    start = time.perf_counter()
    try:
        status, figures = "ok", check.run(ctx)
    except Skipped as why:
        status, figures = "skipped", str(why)
    except Failed as why:
        status, figures = "FAILED", str(why)
    except Exception as error:  # a bug in a row's judging: that row fails, the table goes on
        status, figures = "FAILED", f"{type(error).__name__}: {error}"
    result = Result(check.name, status, time.perf_counter() - start, figures)
    # the figures as each row ends: a run stopped from outside still shows what its finished rows measured
    line = f"  {result.status:<7} {result.check} ({result.seconds:.0f} s): {result.figures}"
    print(line, file=sys.stderr, flush=True)
    return result


def table(results: list[Result]) -> str:
    width = max(len(r.check) for r in results)
    header = f"{'check':<{width}}  {'status':<7}  {'seconds':>7}  figures / reason"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.check:<{width}}  {r.status:<7}  {r.seconds:>7.1f}  {r.figures}")
    return "\n".join(lines)


def cuda_devices() -> tuple[int, str]:
    """(number of visible CUDA devices, the first one's name), asked of a subprocess: this one stays torch-free."""
    probe = "import torch; n = torch.cuda.device_count(); print(n); print(torch.cuda.get_device_name(0) if n else '')"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return 0, ""
    if done.returncode != 0:
        return 0, ""
    count, name = (done.stdout.splitlines() + ["", ""])[:2]
    return int(count or 0), name


def build_tiny_world(ctx: Context) -> None:
    """The tiny world, built once here (rows running side by side would each build it otherwise)."""
    code = "import json; from rlsteps.tiny.build import ensure_tiny_world as e; w = e(seed=0)"
    code += "; print(json.dumps({k: str(v) for k, v in vars(w).items()}))"
    done = call(ctx, "tiny_world", [sys.executable, "-c", code], REPO)
    expect_success(done, "building the tiny world")
    ctx.tiny_world = json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="run the harness on the CPU: the rows a CPU can run")
    parser.add_argument("--smoke-steps", type=int, default=2, help="--cpu-smoke: steps of each tiny run")
    parser.add_argument("--only", nargs="+", metavar="TEXT", help="run the rows whose names contain any of these")
    parser.add_argument("--jobs", type=int, default=4, help="rows run side by side on a GPU (timed rows run alone)")
    parser.add_argument("--timeout", type=float, default=480, help="seconds per subprocess")
    parser.add_argument("--no-targets", action="store_true", help="report the targets' figures, never fail them")
    parser.add_argument("--work", type=Path, help="scratch folder (kept); default: a temporary one, removed if all ok")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["make-policy"]:  # a row's subprocess
        make_policy(Path(argv[1]), argv[2], argv[3])
        return 0
    args = parse_args(argv)
    gpus, name = (0, "") if args.cpu_smoke else cuda_devices()
    if not gpus and not args.cpu_smoke:
        print(NO_CUDA)
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    ctx = Context(work=work, device="cpu" if args.cpu_smoke else "cuda", gpus=gpus, device_name=name or "CPU",
                  smoke_steps=args.smoke_steps, timeout=args.timeout, targets=not args.no_targets, env=env)  # fmt: skip
    print(f"gpu_check on {gpus} x {name}" if gpus else "gpu_check --cpu-smoke: CUDA rows skipped", flush=True)
    print(f"logs and runs under {work}", flush=True)
    handlers = {number: signal.signal(number, interrupted) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        return check_all(ctx, args)
    except KeyboardInterrupt:
        end_all()
        print(f"interrupted; logs and runs under {work}")
        return 130
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


def interrupted(signum: int, frame: object) -> None:
    """Ctrl-C, or SIGTERM (a scheduler's time limit): stop, ending every row's processes on the way out."""
    raise KeyboardInterrupt


def check_all(ctx: Context, args: argparse.Namespace) -> int:
    """Every row, the table, and 1 if any row failed."""
    started = time.perf_counter()
    try:
        build_tiny_world(ctx)
    except Failed as why:
        print(f"FAILED before any row: {why}")
        return 1
    chosen = {c.name: not args.only or any(text in c.name for text in args.only) for c in CHECKS}
    together = [c for c in CHECKS if not c.alone]
    with ThreadPoolExecutor(max(1, args.jobs if not args.cpu_smoke else 1)) as pool:
        try:
            done = pool.map(lambda c: run_check(c, ctx, chosen[c.name]), together)
            results = dict(zip([c.name for c in together], done))
        except KeyboardInterrupt:
            end_all()  # else the pool would wait for its rows to end by themselves
            raise
    for check in CHECKS:
        if check.alone:
            results[check.name] = run_check(check, ctx, chosen[check.name])
    ordered = [results[c.name] for c in CHECKS]
    print(table(ordered))
    counts = {status: sum(r.status == status for r in ordered) for status in ("FAILED", "ok", "skipped")}
    elapsed = time.perf_counter() - started
    print(f"{counts['FAILED']} failed, {counts['ok']} ok, {counts['skipped']} skipped in {elapsed:.0f} s")
    if counts["FAILED"]:
        print(f"logs: {ctx.work / 'logs'}")
    elif args.work is None:
        shutil.rmtree(ctx.work, ignore_errors=True)
    return 1 if counts["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
