"""TRL's GRPOTrainer at gpu_check.py's GRPO shape: the baseline row beside rlsteps's own (`trl grpo 0.37b ...`).

The same policy folder, the tiny world's training prompts and reward model (scored in this process, as a TRL user
passes a reward function), the same rollout shape (prompts x group x new tokens, temperature 1, no top-k or top-p),
one optimizer step of all the rows a step in micro-batches, KL coefficient 0 (no reference model), bf16 autocast over
fp32 weights (`bf16=True`, as rlsteps's `run.dtype=bfloat16`), generation by the model's own `generate` (no vLLM).
Everything else as TRL 1.16 ships it (activation checkpointing among it). Prints one JSON line: the seconds of every
step (a callback from step begin to step end), the peak GPU memory. Exits 3 when trl is not installed.

    python benchmarks/trl_step.py POLICY --reward-model DIR --prompts JSONL --out DIR [--steps 6]
        [--prompts-per-step 32] [--group 8] [--new-tokens 128] [--micro-batch 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from trl_tiny import PLAIN_SAMPLING, QUIET_TRAINER  # benchmarks/ is first on sys.path when a script in it runs

NOT_INSTALLED = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy", type=Path)
    parser.add_argument("--reward-model", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL rows with `messages`")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    return parser.parse_args(argv)


def grpo_config(args: argparse.Namespace):
    from trl import GRPOConfig

    rows = args.prompts_per_step * args.group
    return GRPOConfig(
        output_dir=str(args.out),
        max_steps=args.steps,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        beta=0.0,
        num_generations=args.group,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=rows // args.micro_batch,  # one optimizer step of all the rows
        generation_batch_size=rows,
        num_iterations=1,
        max_completion_length=args.new_tokens,
        bf16=args.device == "cuda",
        use_cpu=args.device == "cpu",
        **PLAIN_SAMPLING,
        **QUIET_TRAINER,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        print("trl: not installed", file=sys.stderr)
        return NOT_INSTALLED
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from rlsteps.engine.rewards.rm.scorer import RewardScorer

    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    model = AutoModelForCausalLM.from_pretrained(args.policy, dtype="float32")
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": row["messages"]} for row in rows])
    scorer = RewardScorer(args.reward_model, device=args.device, batch_size=args.prompts_per_step * args.group)

    def tiny_reward_model(prompts, completions, **_):
        rendered = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
        return scorer.score(rendered, [c[-1]["content"] if isinstance(c, list) else c for c in completions])

    step_seconds: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.begun = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            step_seconds.append(time.perf_counter() - self.begun)

    config = grpo_config(args)
    trainer = GRPOTrainer(model=model, reward_funcs=tiny_reward_model, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimes()])  # fmt: skip
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None
    report = {"step_seconds": step_seconds, "peak_gb": peak, "gradient_checkpointing": config.gradient_checkpointing}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
