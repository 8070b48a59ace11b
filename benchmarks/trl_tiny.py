"""rlsteps against TRL on the tiny world, with the settings matched key by key.

Two pairs, each run as a fresh process from the command to its exit (the wall time) and taking turns:

    rl/reinforce -c tiny   against  TRL's RLOOTrainer  (REINFORCE with a leave-one-out baseline, KL in the reward)
    rl/rlhf -c tiny        against  TRL's GRPOTrainer  (group-normalised advantages, clipped ratio, k3 KL in the loss)

Both sides (rlsteps' given on its command line, MATCHED, so that a change to a tiny config leaves the pair
matched): the tiny world's SFT policy; 16 RL steps; 16 prompts x 4 rollouts x at most 32 new tokens at
temperature 1 (64 rows), one AdamW step of those 64 rows per RL step in micro-batches of 16; lr 3e-4 after 2 warmup
steps (REINFORCE: cosine down to 0.1 of it; GRPO: constant), betas (0.9, 0.98), no weight decay, gradients
clipped at norm 1; KL coefficient 0.01 (REINFORCE: in the reward; GRPO: k3 in the loss, clip 0.2 both sides,
token mean over the batch, advantages over the group's std). Rewards: TRL scores with the tiny reward model in its
own process (a reward function over rlsteps' RewardScorer, the text the model was trained on); rl/reinforce with the
same model through its reward server, rl/rlhf with the tiny judge server over that model (pairwise in a group).
What cannot be matched: TRL's RLOO KL is the sum of the per-token log-ratio of a sequence, rlsteps' REINFORCE the
mean of its absolute value; TRL shuffles the prompts with its own sampler; rlsteps validates greedily every 4
steps and checkpoints every 4 steps (TRL: neither), and writes its output as a Megatron checkpoint (TRL:
save_model, safetensors).

Figures: wall time (process start to exit), seconds per step (median of the steps; rlsteps: its timers/step, TRL:
a callback from step begin to step end) and the whole run's steps/s, summed step time, and the true reward
(`rlsteps.tiny.task:true_reward`) of greedy answers (at most 32 new tokens) to the first 32 validation prompts with
the final policy, computed the same way for both here. The floor is a Python importing torch and transformers'
causal-LM classes, timed in the same rounds.

    python benchmarks/trl_tiny.py                 # both pairs, 1 round (about 3 minutes idle on 2 cores)
    python benchmarks/trl_tiny.py --rounds 3 --pairs reinforce
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_startup import FLOORS  # benchmarks/ is first on sys.path when a script in it runs

STEPS = 16
PROMPTS_PER_STEP = 16
GROUP = 4
MAX_NEW_TOKENS = 32
MICRO_BATCH = 16
LR = 3e-4
WARMUP = 2
BETAS = (0.9, 0.98)
KL = 0.01
VAL_PROMPTS = 32
FLOOR = [sys.executable, "-c", FLOORS["floor"]]
PAIRS = {"reinforce": ("rl/reinforce", "rloo"), "rlhf": ("rl/rlhf", "grpo")}
# The rlsteps side's settings, given on its command line so that they stay matched whatever the tiny configs say
MATCHED = [
    f"train.max_steps={STEPS}",
    f"rollout.prompts_per_step={PROMPTS_PER_STEP}",
    f"rollout.num_rollouts_per_prompt={GROUP}",
    f"rollout.sampling.max_new_tokens={MAX_NEW_TOKENS}",
    "rollout.sampling.temperature=1.0",
    "rollout.sampling.top_p=1.0",
    "rollout.sampling.top_k=0",
    f"train.global_batch_size={PROMPTS_PER_STEP * GROUP}",
    f"train.micro_batch_size={MICRO_BATCH}",
    f"train.lr={LR}",
    f"train.warmup_steps={WARMUP}",
    f"train.betas=[{BETAS[0]},{BETAS[1]}]",
    "train.weight_decay=0.0",
    "train.max_grad_norm=1.0",
    "train.min_lr_ratio=0.1",
]
MATCHED_STEP = {
    "rl/reinforce": ["train.schedule=cosine", f"reinforce.initial_policy_kl_penalty={KL}"],
    "rl/rlhf": [
        "train.schedule=constant",
        f"grpo.kl_beta={KL}",
        "grpo.eps_low=0.2",
        "grpo.eps_high=0.2",
        "grpo.normalize_std=true",
        "grpo.leave_one_out=false",
    ],
}


PLAIN_SAMPLING = dict(temperature=1.0, top_p=1.0, top_k=0)  # TRL's sampling as rlsteps's: no truncation
# a TRL trainer that trains and times, nothing else: no checkpoints, evaluation, reporting or progress bar
QUIET_TRAINER = dict(
    seed=0,
    save_strategy="no",
    eval_strategy="no",
    report_to="none",
    logging_steps=1,
    disable_tqdm=True,
    dataloader_num_workers=0,
)


def trl_config(kind: str, out: Path):
    """The TRL config matching the rlsteps step's tiny config key by key."""
    from trl import GRPOConfig, RLOOConfig

    common = dict(
        output_dir=str(out),
        max_steps=int(os.environ.get("TRL_TINY_STEPS", STEPS)),
        learning_rate=LR,
        warmup_steps=WARMUP,
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=KL,
        num_generations=GROUP,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=PROMPTS_PER_STEP * GROUP // MICRO_BATCH,  # one optimizer step of 64 rows
        generation_batch_size=PROMPTS_PER_STEP * GROUP,
        num_iterations=1,
        max_completion_length=MAX_NEW_TOKENS,
        use_cpu=True,
        bf16=False,
        **PLAIN_SAMPLING,
        **QUIET_TRAINER,
    )
    if kind == "rloo":  # rl/reinforce: cosine to min_lr_ratio 0.1, raw advantages (no std)
        return RLOOConfig(
            **common,
            lr_scheduler_type="cosine_with_min_lr",
            lr_scheduler_kwargs={"min_lr_rate": 0.1},
            normalize_advantages=False,
        )
    return GRPOConfig(  # rl/rlhf: constant after warmup, group std, clip 0.2/0.2, token mean over the batch
        **common,
        lr_scheduler_type="constant_with_warmup",
        epsilon=0.2,
        epsilon_high=0.2,
        scale_rewards="group",
        loss_type="dapo",
    )


def reward_function(reward_model: Path, tokenizer):
    """TRL's reward: the tiny reward model in this process, on the policy's rendered prompt + response + EOS."""
    from rlsteps.engine.rewards.rm.scorer import RewardScorer

    scorer = RewardScorer(reward_model, device="cpu")

    def tiny_reward_model(prompts, completions, **_):
        rendered = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
        return scorer.score(rendered, [c[-1]["content"] if isinstance(c, list) else c for c in completions])

    return tiny_reward_model


def _rlsteps_schedule(trainer_class, kind: str):
    """The trainer with rlsteps' own lr schedule: Transformers' warmup makes the first update at lr 0 (rlsteps':
    at lr / warmup_steps, the peak on update warmup_steps), the rest as its named types ("cosine_with_min_lr",
    "constant_with_warmup") go, one update later."""
    from rlsteps.engine.policy.optim import build_scheduler

    class Trainer(trainer_class):
        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = build_scheduler(
                    optimizer or self.optimizer,
                    warmup_steps=WARMUP,
                    total_steps=num_training_steps,
                    schedule="cosine" if kind == "rloo" else "constant",
                    min_lr_ratio=0.1,
                )
                self._created_lr_scheduler = True
            return self.lr_scheduler

    return Trainer


def trl_child(kind: str, out: Path, started: float) -> None:
    """One TRL run (the process the parent times); writes out/timings.json."""
    marks = {"imports": 0.0}
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer, RLOOTrainer

    from rlsteps.tiny.build import ensure_tiny_world

    marks["imports"] = time.time() - started
    world = ensure_tiny_world()
    tokenizer = AutoTokenizer.from_pretrained(world.policy)
    model = AutoModelForCausalLM.from_pretrained(world.policy, dtype="float32")
    rows = [json.loads(line) for line in world.train_prompts.read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": r["messages"]} for r in rows])
    step_seconds: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.begun = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_seconds.append(time.perf_counter() - self.begun)

    trainer_class = _rlsteps_schedule(RLOOTrainer if kind == "rloo" else GRPOTrainer, kind)
    trainer = trainer_class(
        model=model,
        reward_funcs=reward_function(world.reward_model, tokenizer),
        args=trl_config(kind, out),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimes()],
    )
    marks["trainer built"] = time.time() - started
    trainer.train()
    marks["trained"] = time.time() - started
    trainer.save_model(str(out / "policy"))
    marks["saved"] = time.time() - started
    (out / "timings.json").write_text(json.dumps({"marks": marks, "step_seconds": step_seconds}))


def timed(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    start = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return time.monotonic() - start


def run_rlsteps(step: str, work: Path) -> dict:
    out = work / step.replace("/", "_")
    cmd = [sys.executable, "-m", "rlsteps.cli", "run", step, "-c", "tiny", f"output.dir={out}"]
    cmd += MATCHED + MATCHED_STEP[step]
    if os.environ.get("TRL_TINY_STEPS"):  # a shorter smoke run (both sides)
        cmd.append(f"train.max_steps={os.environ['TRL_TINY_STEPS']}")
    wall = timed(cmd, work)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["timers/step"] for r in records if r.get("timers/step") is not None]
    val = [r for r in records if r.get("val/true_reward") is not None]
    return {
        "wall": wall,
        "step_seconds": steps,
        "policy": out / "policy",
        "own_true_reward": val[-1]["val/true_reward"] if val else None,
        "timers": {
            k: sum(r.get(k) or 0.0 for r in records) for k in {k for r in records for k in r if k.startswith("timers/")}
        },
    }


def run_trl(kind: str, work: Path) -> dict:
    out = work / f"trl_{kind}"
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRL_TINY_STARTED": repr(time.time())}
    wall = timed([sys.executable, __file__, "--child", kind, "--out", str(out)], work, env)
    timings = json.loads((out / "timings.json").read_text())
    return {"wall": wall, "step_seconds": timings["step_seconds"], "policy": out / "policy", "marks": timings["marks"]}


def greedy_true_reward(policy: Path) -> float:
    """Mean true reward of greedy answers (at most MAX_NEW_TOKENS) to the first VAL_PROMPTS validation prompts."""
    import torch

    from rlsteps.engine.policy.model import load_policy
    from rlsteps.tiny.build import ensure_tiny_world
    from rlsteps.tiny.task import true_reward

    world = ensure_tiny_world()
    model, tokenizer = load_policy(policy, device="cpu", dtype=torch.float32)
    rows = [json.loads(line) for line in world.val_prompts.read_text().splitlines() if line.strip()][:VAL_PROMPTS]
    rendered = [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False) for r in rows]
    tokenizer.padding_side = "left"
    batch = tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        generated = model.generate(
            **batch, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, pad_token_id=tokenizer.pad_token_id
        )
    answers = tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return statistics.mean(true_reward(r["messages"], a.strip()) for r, a in zip(rows, answers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=sorted(PAIRS))
    parser.add_argument("--child", choices=["rloo", "grpo"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        trl_child(args.child, args.out, float(os.environ.get("TRL_TINY_STARTED", time.time())))
        return
    print(f"load average at start: {os.getloadavg()}", flush=True)
    subprocess.run(
        [sys.executable, "-c", "from rlsteps.tiny.build import ensure_tiny_world; ensure_tiny_world()"], check=True
    )
    results: dict[str, list[dict]] = {}
    floors = []
    with tempfile.TemporaryDirectory(prefix="trl-tiny-") as tmp:
        for round_ in range(args.rounds):
            floors.append(timed(FLOOR, Path(tmp)))
            for pair in args.pairs:
                step, kind = PAIRS[pair]
                for name in (step, f"TRL {kind}"):
                    work = Path(tmp) / f"r{round_}-{name.replace('/', '_').replace(' ', '_')}"
                    work.mkdir()
                    result = run_trl(kind, work) if name.startswith("TRL") else run_rlsteps(step, work)
                    result["true_reward"] = greedy_true_reward(result["policy"])
                    results.setdefault(name, []).append(result)
                    print(f"round {round_ + 1} {name}: {result['wall']:.1f} s", flush=True)
    floor = statistics.median(floors)
    print(f"load average at end: {os.getloadavg()}")
    print(f"\nfloor (import torch + transformers' causal LM): median {floor:.2f} s of {len(floors)}\n")
    head = "| run | wall s | s/step (median) | steps/s (whole run) | sum of steps s | wall - steps s | "
    print(head + "wall / (floor + steps) | true reward (greedy, 32 val) |")
    print("|" + "---|" * 8)
    for name, runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        per_step = statistics.median(s for r in runs for s in r["step_seconds"])
        summed = statistics.median(sum(r["step_seconds"]) for r in runs)
        reward = statistics.median(r["true_reward"] for r in runs)
        own = [r.get("own_true_reward") for r in runs if r.get("own_true_reward") is not None]
        own_note = f" (its own val/true_reward {statistics.median(own):.3f})" if own else ""
        print(
            f"| {name} | {wall:.2f} | {per_step:.3f} | {STEPS / wall:.2f} | {summed:.2f} | {wall - summed:.2f} | "
            f"{wall / (floor + summed):.2f} | {reward:.3f}{own_note} |"
        )
    for name, runs in results.items():
        if "timers" in runs[0]:
            timers = {k: statistics.median(r["timers"][k] for r in runs) for k in runs[0]["timers"]}
            print(
                f"\n{name} timers (summed over the run, median of rounds): "
                + ", ".join(f"{k[7:]} {v:.2f}" for k, v in sorted(timers.items()))
            )
        if "marks" in runs[0]:
            marks = {k: statistics.median(r["marks"][k] for r in runs) for k in runs[0]["marks"]}
            print(f"\n{name} reached (s from start): " + ", ".join(f"{k} {v:.2f}" for k, v in marks.items()))


if __name__ == "__main__":
    main()
