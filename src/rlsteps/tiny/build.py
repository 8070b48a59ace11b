"""The offline tiny world: a tokenizer, an SFT policy, a reward model and prompts, built on a CPU.

`ensure_tiny_world(seed)` builds it on first use (under a minute on two cores), caches it under
$RLSTEPS_HOME (default ~/.cache/rlsteps) in tiny/<version>-seed<seed> (see rlsteps.tiny.layout),
and returns at once afterwards. Nothing is downloaded; the same seed gives bit-identical weights,
tokenizer and prompts on the same machine and library versions.

    tokenizer/  policy/  reward_model/   Hugging Face save_pretrained folders (safetensors);
                                         the tokenizer is saved into both model folders too
    train.jsonl  val.jsonl                {"id", "messages": [{"role": "user", "content"}]}
    world.json   README.md                recipe, sizes, seed, build time, measured quality

The task and its hidden preference live in rlsteps.tiny.task. The build writes into a temporary
folder beside the target and renames it into place, under a file lock, so a killed build never
leaves a half world and concurrent callers build once.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from rlsteps.engine.megatron.format import save_megatron_checkpoint
from rlsteps.engine.rewards.judge.scale import JUDGE_SCALE_KEY
from rlsteps.tiny import preferences
from rlsteps.tiny import task as tiny_task
from rlsteps.tiny.evaluate import evaluate_world
from rlsteps.tiny.hyperparameters import BUILD_THREADS, POLICY_SIZE, PROMPTS, REWARD_BACKBONE_SIZE, RM, SFT
from rlsteps.tiny.layout import TINY_WORLD_VERSION, TinyWorld, load_tiny_world, tiny_world_dir, tiny_world_paths
from rlsteps.tiny.models import build_random_causal_lm, reward_model_from_policy
from rlsteps.tiny.tokenizer import save_tokenizer, train_tokenizer
from rlsteps.tiny.training import Log, RepeatUnlikelihood, judge_scale, train_reward_model, train_sft


def ensure_tiny_world(seed: int = 0, home: Path | None = None, log: Log | None = None) -> TinyWorld:
    """The tiny world for `seed`, built on first use; later calls return at once."""
    world = load_tiny_world(seed, home)
    if world is not None:
        return world
    target = tiny_world_dir(seed, home)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.with_name(target.name + ".lock")):
        world = load_tiny_world(seed, home)  # another process may have built it while we waited
        if world is not None:
            return world
        _remove_abandoned_builds(target)
        staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(target), dir=target.parent))
        staging.chmod(0o755)  # mkdtemp makes it private; the world is a shared cache
        try:
            _build_world(staging, seed, log or _stderr_log)
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return tiny_world_paths(seed, home)


def _staging_prefix(target: Path) -> str:
    return f".{target.name}.building-"


def _remove_abandoned_builds(target: Path) -> None:
    """Staging folders left by killed builds; safe to remove because we hold the world's lock."""
    for leftover in target.parent.glob(_staging_prefix(target) + "*"):
        shutil.rmtree(leftover, ignore_errors=True)


@contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stderr_log(message: str) -> None:
    from rich.console import Console

    Console(stderr=True).log(f"tiny world: {message}", highlight=False)


@contextmanager
def _build_settings(seed: int) -> Iterator[None]:
    """Fixed threads and seed, no save progress bars; the caller's settings and RNG state come back after."""
    threads, progress_bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    torch.set_num_threads(BUILD_THREADS)
    hf_logging.disable_progress_bar()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(threads)
        if progress_bars:
            hf_logging.enable_progress_bar()


def _build_world(root: Path, seed: int, log: Log) -> None:
    started = time.perf_counter()
    rng = random.Random(seed)
    with _build_settings(seed):
        log("training the tokenizer")
        tokenizer = train_tokenizer(tiny_task.tokenizer_corpus(rng, 4000))
        save_tokenizer(tokenizer, root / "tokenizer")

        log(f"SFT of the policy, a {_shape(POLICY_SIZE)} Llama")
        policy = build_random_causal_lm("llama", tokenizer, seed, **POLICY_SIZE)
        unlikelihood = RepeatUnlikelihood(
            SFT["repeat_unlikelihood"], SFT["unordered_rows"], random.Random(f"{seed}-unordered")
        )
        sft_loss = train_sft(policy, tokenizer, rng, log, SFT["policy_steps"], unlikelihood)
        policy.save_pretrained(root / "policy")
        shutil.copytree(root / "tokenizer", root / "policy", dirs_exist_ok=True)
        log("writing the policy as a Megatron-Core distributed checkpoint too")
        # local_files_only given, not read from the environment (HF_HUB_OFFLINE): the tokenizer records it in the
        # tokenizer_config.json it saves, and the world's bytes must not depend on where it was built
        tokenizer_read_back = AutoTokenizer.from_pretrained(root / "policy", local_files_only=True)
        save_megatron_checkpoint(policy, tokenizer_read_back, root / "policy_megatron")

        log(f"SFT of the reward model's backbone, a {_shape(REWARD_BACKBONE_SIZE)} Llama")
        backbone = build_random_causal_lm("llama", tokenizer, seed + 1, **REWARD_BACKBONE_SIZE)
        train_sft(backbone, tokenizer, rng, log, SFT["backbone_steps"])
        log("Bradley-Terry training of the reward model")
        reward_model = reward_model_from_policy(backbone)
        rm_loss = train_reward_model(reward_model, tokenizer, rng, log)
        scale = judge_scale(reward_model, tokenizer, random.Random(f"{seed}-judge-scale"), RM["judge_scale_answers"])
        setattr(reward_model.config, JUDGE_SCALE_KEY, scale)
        reward_model.save_pretrained(root / "reward_model")
        shutil.copytree(root / "tokenizer", root / "reward_model", dirs_exist_ok=True)

        log("measuring the policy and the reward model")
        quality = evaluate_world(policy, reward_model, tokenizer, random.Random(seed + 1))

    train, val = tiny_task.prompt_records(seed, PROMPTS["train"], PROMPTS["val"])
    _write_jsonl(root / "train.jsonl", train)
    _write_jsonl(root / "val.jsonl", val)
    metadata = {
        "version": TINY_WORLD_VERSION,
        "seed": seed,
        "task": " ".join(tiny_task.__doc__.split("\n\n")[1].split()),
        "preference": "rlsteps.tiny.task.true_reward: the task's sentence scores +1 for naming the prompt's noun, "
        f"+0.5 per positive adjective, -0.5 per negative adjective (best {tiny_task.BEST_TRUE_REWARD}); any other "
        "answer that sum capped at 0.0",
        "reward_model_pairs": " ".join(preferences.__doc__.split("\n\n")[0].split()),
        "sizes": {
            "vocab": len(tokenizer),
            "policy_params": sum(p.numel() for p in policy.parameters()),
            "reward_model_params": sum(p.numel() for p in reward_model.parameters()),
            "train_prompts": len(train),
            "val_prompts": len(val),
        },
        "recipe": {
            "policy": POLICY_SIZE,
            "reward_backbone": REWARD_BACKBONE_SIZE,
            "sft": SFT,
            "reward_model": RM,
            "build_threads": BUILD_THREADS,
        },
        "final_loss": {"sft": sft_loss, "reward_model": rm_loss},
        "quality": quality,
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    (root / "world.json").write_text(json.dumps(metadata, indent=2) + "\n")
    (root / "README.md").write_text(_readme(metadata))
    log(f"built in {metadata['build_seconds']} s: {json.dumps(quality)}")


def _shape(size: dict[str, int]) -> str:
    return f"{size['hidden']}-wide, {size['layers']}-layer"


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def _readme(metadata: dict) -> str:
    return (
        f"# rlsteps tiny world {metadata['version']} (seed {metadata['seed']})\n\n"
        f"{metadata['task']}\n\nHidden preference: {metadata['preference']}.\n\n"
        f"Reward model pairs: {metadata['reward_model_pairs']}\n\n"
        "Folders: `tokenizer/`, `policy/` (LlamaForCausalLM after SFT), `policy_megatron/` (the same\n"
        "policy as a Megatron-Core distributed checkpoint), `reward_model/`\n"
        "(LlamaForSequenceClassification, one label, Bradley-Terry), all Hugging Face save_pretrained\n"
        "with safetensors. Prompts: `train.jsonl`, `val.jsonl`. The reward model scores\n"
        "`rlsteps.engine.rewards.text.reward_input_text(chat_prompt, response, eos_token)`.\n\n"
        f"```json\n{json.dumps({k: metadata[k] for k in ('sizes', 'quality', 'build_seconds')}, indent=2)}\n```\n"
    )
