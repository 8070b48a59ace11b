"""The verifiable example side by side: rlsteps (rl/reinforce and rl/rlhf with the function reward) and TRL's
RLOOTrainer and GRPOTrainer, on the same policy, prompts, reward function, group size and token budget.

    python benchmarks/trl_verifiable.py [--steps 8] [--systems rlsteps-reinforce rlsteps-grpo trl-rloo trl-grpo]
                                        [--policy PATH] [--out benchmarks/results/verifiable] [--plot PNG]
                                        [--lora [--lora-dim 8 --lora-alpha 32 --lora-lr 1e-4]]

Each system trains SmolLM2-135M-Instruct (`${examples:smollm2_135m_instruct}`, or --policy) on
rlsteps/examples/verifiable's train.jsonl for --steps steps with the sizes of the shipped rl/rlhf verifiable config
(read from it: prompts per step, rollouts per prompt, new tokens, learning rate, KL coefficient, validation
interval; 16 x 4 rollouts of at most 8 new tokens at lr 2e-5 and KL 0.01 today), temperature 1, the rate constant
after one warm-up step, Adam betas 0.9/0.98, no weight decay, gradient norm clipped at 1, one optimizer step per
rollout step; the reward is rlsteps.engine.rewards.verifiable:exact_match (TRL's reward-function signature wrapped
around it). Every validation interval (and before the first) each is validated the same way: greedy, 8 new tokens,
the 64 validation prompts, the share of exact matches. The rlsteps runs use the shipped configs
(steps/rl/*/verifiable.yaml) as they are, apart from max_steps and output.dir; their accuracy is their own
val/reward/exact_match. TRL's validation is a callback here that generates with the trainer's model between steps
(Hugging Face generate; excluded from the step times).

Paired, per question: the answers right after the last step and not before it (gained), the other way (lost), and
the one-sided sign test's p-value of that many gains among the changed answers (McNemar's exact test: how often a
policy that did not improve would gain as many by chance); rlsteps' final answers are its output policy's.

Seconds per step: rlsteps's timers/step (rollouts, rewards, update); TRL's, the time of its training step
(on_step_begin to on_step_end, generation included). Results go to OUT/<system>.json, a table on stdout and the
curve to --plot (OUT/accuracy.png unless given; README's figure: `--plot benchmarks/trl_verifiable.png`).

With --lora every system trains LoRA adapters with the same peft config instead of the whole policy: rank
--lora-dim, alpha --lora-alpha, no dropout, every linear layer but the output layer (rlsteps's train.lora, TRL's
peft_config with target_modules "all-linear"), at --lora-lr; the systems are named <system>-lora.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench_startup import log_time  # benchmarks/ is first on sys.path when a script in it runs

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("rlsteps-reinforce", "rlsteps-grpo", "trl-rloo", "trl-grpo")
RLSTEPS_STEP = {"rlsteps-reinforce": "rl/reinforce", "rlsteps-grpo": "rl/rlhf"}


# The shipped rl/rlhf verifiable config, which TRL's runs are matched to.
SHIPPED = yaml.safe_load((REPO / "steps" / "rl" / "rlhf" / "verifiable.yaml").read_text())
PROMPTS_PER_STEP = SHIPPED["rollout"]["prompts_per_step"]
GROUP = SHIPPED["rollout"]["num_rollouts_per_prompt"]
MAX_NEW_TOKENS = SHIPPED["rollout"]["sampling"]["max_new_tokens"]
LR = SHIPPED["train"]["lr"]
KL = SHIPPED["grpo"]["kl_beta"]
VAL_INTERVAL = SHIPPED["validation"]["interval"]
SEED = 0


def load_rows(split: str) -> list[dict]:
    from rlsteps.examples import example_path

    return [json.loads(line) for line in example_path(f"verifiable_{split}").read_text().splitlines()]


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------------------------------
# rlsteps: the shipped configs, run as a user runs them


def run_rlsteps(
    system: str, policy: Path, steps: int, out: Path, threads: int | None, lora: dict | None, seed: int = SEED
) -> dict:
    run_dir = out / f"{named(system, lora)}-run"
    command = [
        sys.executable,
        "-m",
        "rlsteps.cli",
        "run",
        RLSTEPS_STEP[system],
        "-c",
        "verifiable",
        f"inputs.policy={policy}",
        f"train.max_steps={steps}",
        f"output.dir={run_dir}",
        f"seed={seed}",
        *([f"run.num_threads={threads}"] if threads else []),
        *(["train.lora.enabled=true", f"train.lora.dim={lora['r']}", f"train.lora.alpha={lora['lora_alpha']}",
           f"train.lr={lora['lr']}"] if lora else []),
    ]  # fmt: skip
    started = time.time()
    subprocess.run(command, check=True, cwd=out)
    result = rlsteps_result(named(system, lora), run_dir)
    result["wall_s"] = time.time() - started
    result["final_correct"] = [o["exact_match"] for o in policy_outcomes(run_dir / "policy")]
    return result


def rlsteps_result(system: str, run_dir: Path) -> dict:
    """The figures of an rlsteps run directory (one this script started, or one given with --from-run)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    accuracy = {r["step"]: r["val/reward/exact_match"] for r in records if "val/reward/exact_match" in r}
    one_word = {r["step"]: r["val/one_word"] for r in records if "val/one_word" in r}
    seconds = [r["timers/step"] for r in records if "timers/step" in r]
    wall = logged_wall_s(run_dir / "train.log")
    return {"system": system, "accuracy": accuracy, "one_word": one_word, "step_seconds": seconds, "wall_s": wall}


def logged_wall_s(train_log: Path) -> float | None:
    """Seconds from the first to the last timestamped line of a run's train.log: the worker's time, which leaves
    out the command's own second before it; the figure of a run given with --from-run (None without a log)."""
    stamps = []
    for line in train_log.read_text().splitlines() if train_log.is_file() else []:
        with contextlib.suppress(ValueError):
            stamps.append(log_time(line))
    return (stamps[-1] - stamps[0]).total_seconds() if len(stamps) > 1 else None


# ---------------------------------------------------------------------------------------------------------------
# TRL: the same data, reward, sizes and optimizer settings through its trainers


def trl_reward(prompts, completions, answer, **_):
    """TRL's reward signature (lists of prompts, completions and the dataset's columns) around exact_match."""
    from rlsteps.engine.rewards.verifiable import exact_match

    return [
        exact_match(p, c[0]["content"] if isinstance(c, list) else c, a)
        for p, c, a in zip(prompts, completions, answer)
    ]


def _as_list(answer: str | list[str]) -> list[str]:
    return answer if isinstance(answer, list) else [answer]


def greedy_validation(model, tokenizer, rows: list[dict]) -> dict[str, float]:
    outcomes = greedy_outcomes(model, tokenizer, rows)
    return {
        "exact_match": sum(o["exact_match"] for o in outcomes) / len(rows),
        "one_word": sum(o["one_word"] for o in outcomes) / len(rows),
    }


def greedy_outcomes(model, tokenizer, rows: list[dict]) -> list[dict[str, bool]]:
    """Each validation question's greedy answer judged: exact match, and one word (right or wrong)."""
    import torch

    from rlsteps.engine.rewards.verifiable import exact_match, one_word

    was_training = model.training
    model.eval()
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    outcomes = []
    with torch.no_grad():
        for start in range(0, len(rows), 32):
            batch = rows[start : start + 32]
            texts = [
                tokenizer.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True) for r in batch
            ]
            encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            output = model.generate(**encoded, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
            for row, ids in zip(batch, output):
                response = tokenizer.decode(ids[encoded.input_ids.shape[1] :], skip_special_tokens=True)
                outcomes.append(
                    {
                        "exact_match": bool(exact_match(row["messages"], response, row["answer"])),
                        "one_word": bool(one_word(row["messages"], response)),
                    }
                )
    tokenizer.padding_side = side
    model.train(was_training)
    return outcomes


def paired_change(first: list[bool], last: list[bool]) -> dict[str, float]:
    """Questions answered right at the last validation and not the first (gained), the other way (lost), and the
    one-sided sign test's p-value of so many gains among the changed answers (McNemar's exact test): how often a
    policy that did not improve would gain at least this many by chance."""
    gained = sum(b and not a for a, b in zip(first, last))
    lost = sum(a and not b for a, b in zip(first, last))
    changed = gained + lost
    p = sum(math.comb(changed, k) for k in range(gained, changed + 1)) / 2**changed if changed else 1.0
    return {"gained": gained, "lost": lost, "sign_p": p}


@functools.cache
def base_correct(policy: Path) -> list[bool]:
    """Which validation questions the policy before training answers right, greedy (computed once)."""
    return [o["exact_match"] for o in policy_outcomes(policy)]


def policy_outcomes(path: Path) -> list[dict[str, bool]]:
    """The greedy outcomes of a policy on disk: a Hugging Face folder, or an rlsteps run's output (checkpoint_megatron,
    LoRA merged)."""
    from rlsteps.engine.policy.model import load_policy

    model, tokenizer = load_policy(path)
    return greedy_outcomes(model, tokenizer, load_rows("val"))


def run_trl(
    system: str,
    policy: Path,
    steps: int,
    out: Path,
    threads: int | None,
    lora: dict | None,
    seed: int = SEED,
    first_validation: bool = True,
) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    rows = load_rows("train")  # every answer a list of accepted answers: one column type
    train = Dataset.from_list([{"prompt": r["messages"], "answer": _as_list(r["answer"])} for r in rows])
    val = load_rows("val")
    common = dict(
        output_dir=str(out / f"{named(system, lora)}-run"),
        max_steps=steps,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP,  # completions per optimizer step
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0,
        learning_rate=lora["lr"] if lora else LR,
        lr_scheduler_type="constant",  # rlsteps's warmup_steps=1 is the full rate from the first update; HF's
        warmup_steps=0,  # constant_with_warmup with 1 step would make TRL's first update one of rate 0
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.98,
        max_grad_norm=1.0,
        beta=KL,
        num_iterations=1,
        steps_per_generation=1,
        use_cpu=True,
        seed=seed,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        bf16=False,
    )
    if system == "trl-rloo":
        trainer_cls, args = RLOOTrainer, RLOOConfig(**common)
    else:
        trainer_cls, args = GRPOTrainer, GRPOConfig(**common)

    accuracy, one_word, step_seconds, last = {}, {}, [], []

    class Measure(TrainerCallback):
        started = 0.0

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if first_validation:
                self._validate(0, model)

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            step_seconds.append(time.perf_counter() - self.started)
            print(f"{system} step {state.global_step}: {step_seconds[-1]:.1f} s", flush=True)
            if state.global_step % VAL_INTERVAL == 0 or state.global_step == steps:
                self._validate(state.global_step, model)

        def _validate(self, step, model):
            last[:] = greedy_outcomes(model, tokenizer, val)
            accuracy[step] = sum(o["exact_match"] for o in last) / len(val)
            one_word[step] = sum(o["one_word"] for o in last) / len(val)
            print(
                f"{system} step {step}: val exact_match {accuracy[step]:.3f} one_word {one_word[step]:.3f}", flush=True
            )

    trainer = trainer_cls(
        model=model,
        reward_funcs=trl_reward,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[Measure()],
        peft_config=peft_config(lora),
    )
    started = time.time()
    trainer.train()
    return {
        "system": named(system, lora),
        "accuracy": accuracy,
        "one_word": one_word,
        "step_seconds": step_seconds,
        "wall_s": time.time() - started,
        "final_correct": [o["exact_match"] for o in last],  # the last validation's, after the last step
    }


def peft_config(lora: dict | None):
    """TRL's peft_config for the adapters rlsteps's train.lora makes (every linear layer but the output layer)."""
    if not lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora["r"], lora_alpha=lora["lora_alpha"], lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )


def named(system: str, lora: dict | None) -> str:
    return f"{system}-lora" if lora else system


# ---------------------------------------------------------------------------------------------------------------


def report(results: list[dict]) -> str:
    steps = sorted({int(s) for r in results for s in r["accuracy"]})
    head = "| system | " + " | ".join(f"step {s}" for s in steps) + " | gained / lost (sign test p) |"
    lines = [head + " s/step (median) | wall s |", "|" + "---|" * (len(steps) + 4)]
    for r in results:
        accuracy = {int(k): v for k, v in r["accuracy"].items()}
        cells = [f"{accuracy[s]:.2f}" if s in accuracy else "" for s in steps]
        paired = r.get("paired")
        change = f"{paired['gained']} / {paired['lost']} ({paired['sign_p']:.3f})" if paired else ""
        median = statistics.median(r["step_seconds"]) if r["step_seconds"] else float("nan")
        wall = f"{r['wall_s']:.0f}" if r.get("wall_s") else ""
        lines.append(f"| {r['system']} | " + " | ".join(cells) + f" | {change} | {median:.1f} | {wall} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.6))
    for r in results:
        points = sorted((int(k), v) for k, v in r["accuracy"].items())
        axis.plot([s for s, _ in points], [v for _, v in points], marker="o", label=r["system"])
    axis.set_xlabel(f"RL step ({PROMPTS_PER_STEP} prompts x {GROUP} rollouts)")
    axis.set_ylabel("greedy validation exact match")
    axis.set_title("SmolLM2-135M-Instruct on the verifiable example (64 validation prompts)")
    axis.title.set_fontsize(9)
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=SHIPPED["train"]["max_steps"])
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--policy", type=Path, default=None, help="SmolLM2-135M-Instruct as a Hugging Face folder")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "verifiable")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of each run (default: torch's)")
    parser.add_argument(
        "--from-run",
        nargs=2,
        action="append",
        default=[],
        metavar=("SYSTEM", "RUN_DIR"),
        help="an rlsteps run's figures (its wall time from its train.log: the worker's, without the command's start)",
    )
    parser.add_argument(
        "--no-first-validation",
        action="store_true",
        help="TRL: no validation before the first step (the policy's figure then is the same for every system)",
    )
    # default: beside the results (OUT/accuracy.png); README's figure is written only when asked for by name, so a
    # run of one system or with --lora never replaces the four systems' plot
    parser.add_argument("--plot", type=Path, help="the curve's PNG (default: OUT/accuracy.png)")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (the same peft config for each)")
    parser.add_argument("--lora-dim", type=int, default=8)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--lora-lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=SEED, help="each run's seed (rlsteps' seed, TRL's and torch's)")
    options = parser.parse_args()
    lora = dict(r=options.lora_dim, lora_alpha=options.lora_alpha, lr=options.lora_lr) if options.lora else None
    if options.policy is None:
        from rlsteps.examples.smollm2 import ensure_smollm2

        options.policy = ensure_smollm2()
    options.out.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {load_avg()}", flush=True)
    for system, run_dir in options.from_run:
        (options.out / f"{system}.json").write_text(json.dumps(rlsteps_result(system, Path(run_dir)), indent=1))
    for system in options.systems if not options.from_run else []:
        arguments = (
            system, options.policy.resolve(), options.steps, options.out.resolve(), options.threads, lora, options.seed
        )  # fmt: skip
        if system in RLSTEPS_STEP:
            result = run_rlsteps(*arguments)
        else:
            result = run_trl(*arguments, first_validation=not options.no_first_validation)
        result["load_avg_end"] = load_avg()
        result["paired"] = paired_change(base_correct(options.policy), result["final_correct"])
        (options.out / f"{named(system, lora)}.json").write_text(json.dumps(result, indent=1))
    results = [json.loads(p.read_text()) for s in SYSTEMS if (p := options.out / f"{named(s, lora)}.json").is_file()]
    print(report(results))
    curve = options.plot or options.out / "accuracy.png"
    plot(results, curve)
    print(f"load average at end: {load_avg()}; curve: {curve}")


if __name__ == "__main__":
    main()
