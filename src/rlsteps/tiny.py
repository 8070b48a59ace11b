"""The offline tiny world: a tokenizer, an SFT policy, a reward model and prompts, built on a CPU.

`ensure_tiny_world(seed)` builds it on first use (about 20 s on two cores), caches it under
$RLSTEPS_HOME (default ~/.cache/rlsteps) in tiny/<version>-seed<seed> (see rlsteps.tiny_layout),
and returns at once afterwards. Nothing is downloaded; the same seed gives bit-identical weights,
tokenizer and prompts on the same machine and library versions.

    tokenizer/  policy/  reward_model/   Hugging Face save_pretrained folders (safetensors);
                                         the tokenizer is saved into both model folders too
    train.jsonl  val.jsonl                {"id", "messages": [{"role": "user", "content"}]}
    world.json   README.md                recipe, sizes, seed, build time, measured quality

The task and its hidden preference live in rlsteps.tiny_task. The build writes into a temporary
folder beside the target and renames it into place, under a file lock, so a killed build never
leaves a half world and concurrent callers build once.
"""

from __future__ import annotations

import copy
import fcntl
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.optim.lr_scheduler import LambdaLR
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)
from transformers.utils import logging as hf_logging

from rlsteps import tiny_task
from rlsteps.engine.megatron.checkpoint import save_megatron_checkpoint
from rlsteps.engine.rewards.text import reward_input_text
from rlsteps.tiny_layout import TINY_WORLD_VERSION, TinyWorld, tiny_world_dir, tiny_world_paths

PAD, EOS = "<|pad|>", "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('tiny chat roles are system, user and assistant, got ' + message['role']) }}"
    "{%- endif -%}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>\n{% endif -%}"
)

# The recipe. Changing it changes the world: bump TINY_WORLD_VERSION (rlsteps.tiny_layout), part of the cache key.
BUILD_THREADS = 1  # fixed, so the weights do not depend on the machine; also the fastest on a shared CPU
TOKENIZER_VOCAB = 640  # an upper bound: the merges run out near 580, with every task word one token
POLICY_SIZE = {"hidden": 64, "layers": 2}
SFT = {"steps": 250, "batch": 32, "lr": 3e-3}
RM = {"steps": 120, "batch": 32, "lr": 5e-3, "heldout_pairs": 512}
EVAL = {"samples": 128, "max_new_tokens": 32}
INIT_STD = 0.1  # larger than the usual 0.02: tiny widths then learn to copy the noun within a few hundred steps
PROMPTS = {"train": 256, "val": 32}

Log = Callable[[str], None]


# --- cache, lock, atomic build ----------------------------------------------------------------


def load_tiny_world(seed: int = 0, home: Path | None = None) -> TinyWorld | None:
    """The built world, or None. Only a finished build has world.json (it is renamed into place whole)."""
    world = tiny_world_paths(seed, home)
    if (world.root / "world.json").is_file():
        return world
    if world.root.exists():
        raise RuntimeError(f"{world.root} exists but is not a finished tiny world (no world.json): delete it and retry")
    return None


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


# --- tokenizer and models ---------------------------------------------------------------------


def train_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE (any text encodes) with pad, eos and role tokens, and the tiny chat template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=[PAD, EOS, *ROLE_TOKENS.values()],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        chat_template=CHAT_TEMPLATE,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    """save_pretrained, with a tokenizer_config.json that older transformers versions read too."""
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["additional_special_tokens"] = config.pop("extra_special_tokens", list(ROLE_TOKENS.values()))
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def chat_prompt(tokenizer: PreTrainedTokenizerFast, user_text: str) -> str:
    """The rendered prompt the policy sees, ending with the assistant header."""
    messages = [{"role": "user", "content": user_text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def build_random_causal_lm(
    arch: str, tokenizer: PreTrainedTokenizerFast, seed: int, hidden: int = 64, layers: int = 2
) -> PreTrainedModel:
    """A randomly initialised causal LM for `tokenizer`: "llama", "qwen2" (grouped KV heads, qkv bias) or "gpt2"."""
    special = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
        "tie_word_embeddings": True,
        "initializer_range": INIT_STD,
    }
    decoder = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=256)
    if arch == "llama":
        config = LlamaConfig(intermediate_size=4 * hidden, num_key_value_heads=4, **decoder, **special)
    elif arch == "qwen2":
        config = Qwen2Config(intermediate_size=3 * hidden, num_key_value_heads=2, **decoder, **special)
    elif arch == "gpt2":
        config = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=256, **special)
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}: use one of 'llama', 'qwen2', 'gpt2'")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def reward_model_from_policy(policy: PreTrainedModel) -> PreTrainedModel:
    """A one-label sequence classifier whose backbone starts from the SFT policy (a fresh score head)."""
    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    reward_model = AutoModelForSequenceClassification.from_config(config)
    reward_model.base_model.load_state_dict(policy.base_model.state_dict())
    return reward_model


# --- training ---------------------------------------------------------------------------------


def _optimizer(model: PreTrainedModel, lr: float, steps: int) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW, linear warmup over 10% of the steps, cosine decay to 10% of lr."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, steps // 10)

    def scale(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    return optimizer, LambdaLR(optimizer, scale)


def sft_batch(tokenizer: PreTrainedTokenizerFast, examples: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Right-padded chat prompt + response + EOS; labels are -100 on the prompt and the padding."""
    prompts = tokenizer([chat_prompt(tokenizer, p) for p, _ in examples], add_special_tokens=False)["input_ids"]
    responses = tokenizer([r for _, r in examples], add_special_tokens=False)["input_ids"]
    rows = [(p, r + [tokenizer.eos_token_id]) for p, r in zip(prompts, responses)]
    width = max(len(p) + len(r) for p, r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        input_ids[i, :n] = torch.tensor(p + r)
        labels[i, len(p) : n] = torch.tensor(r)
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def train_sft(policy: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rng: random.Random, log: Log) -> float:
    """Masked next-token NLL on fresh SFT examples each step; returns the last loss."""
    optimizer, schedule = _optimizer(policy, SFT["lr"], SFT["steps"])
    policy.train()
    for step in range(1, SFT["steps"] + 1):
        batch = sft_batch(tokenizer, tiny_task.sft_examples(rng, SFT["batch"]))
        logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, T, V]
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100)
        _step(loss, policy, optimizer, schedule)
        if step % 100 == 0 or step == SFT["steps"]:
            log(f"SFT step {step}/{SFT['steps']}  loss {loss.item():.3f}")
    policy.eval()
    return round(loss.item(), 4)


def reward_scores(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompts: list[str], responses: list[str]
) -> torch.Tensor:  # [B]
    """Scores of (rendered chat prompt, decoded response) pairs, on exactly the text a server scores."""
    texts = [reward_input_text(p, r, tokenizer.eos_token) for p, r in zip(prompts, responses, strict=True)]
    encoded = tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt")
    return reward_model(**encoded).logits[:, 0]


def train_reward_model(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rng: random.Random, log: Log
) -> float:
    """Bradley-Terry: -log sigmoid(r_chosen - r_rejected) on fresh preference pairs each step."""
    optimizer, schedule = _optimizer(reward_model, RM["lr"], RM["steps"])
    reward_model.train()
    for step in range(1, RM["steps"] + 1):
        prompts, chosen, rejected = zip(*tiny_task.preference_pairs(rng, RM["batch"]))
        rendered = [chat_prompt(tokenizer, p) for p in prompts]
        scores = reward_scores(reward_model, tokenizer, rendered * 2, list(chosen + rejected))  # [2B]
        loss = -F.logsigmoid(scores[: len(chosen)] - scores[len(chosen) :]).mean()
        _step(loss, reward_model, optimizer, schedule)
        if step % 100 == 0 or step == RM["steps"]:
            log(f"reward model step {step}/{RM['steps']}  loss {loss.item():.3f}")
    reward_model.eval()
    return round(loss.item(), 4)


def _step(loss: torch.Tensor, model: PreTrainedModel, optimizer: torch.optim.Optimizer, schedule: LambdaLR) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()


# --- measurement ------------------------------------------------------------------------------


@torch.no_grad()
def sample_responses(
    policy: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompts: list[str], max_new_tokens: int = 32
) -> list[tuple[str, bool]]:
    """(decoded response, ended with EOS) for each rendered prompt, sampled at temperature 1."""
    encoded = tokenizer(prompts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
    output = policy.generate(
        **encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    results = []
    for row in output[:, encoded["input_ids"].shape[1] :].tolist():
        ended = tokenizer.eos_token_id in row
        response = row[: row.index(tokenizer.eos_token_id)] if ended else row
        results.append((tokenizer.decode(response, skip_special_tokens=True), ended))
    return results


@torch.no_grad()
def pair_accuracy(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[str, str, str]]
) -> float:
    prompts, chosen, rejected = zip(*pairs)
    rendered = [chat_prompt(tokenizer, p) for p in prompts]
    chosen_scores = reward_scores(reward_model, tokenizer, rendered, list(chosen))
    rejected_scores = reward_scores(reward_model, tokenizer, rendered, list(rejected))
    return (chosen_scores > rejected_scores).float().mean().item()


@torch.no_grad()
def evaluate_world(
    policy: PreTrainedModel, reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rng: random.Random
) -> dict[str, float]:
    """SFT samples: EOS rate and true reward; reward model: held-out pair accuracy, correlation with true_reward."""
    accuracy = pair_accuracy(reward_model, tokenizer, tiny_task.preference_pairs(rng, RM["heldout_pairs"]))
    prompts = [tiny_task.sample_prompt(rng)[0] for _ in range(EVAL["samples"])]
    rendered = [chat_prompt(tokenizer, p) for p in prompts]
    responses, ended = zip(*sample_responses(policy, tokenizer, rendered, EVAL["max_new_tokens"]))
    true = torch.tensor([tiny_task.true_reward(p, r) for p, r in zip(prompts, responses)])
    scores = reward_scores(reward_model, tokenizer, rendered, list(responses))
    return {
        "sft_eos_rate": round(sum(ended) / len(ended), 4),
        "sft_mean_true_reward": round(true.mean().item(), 4),
        "best_true_reward": tiny_task.BEST_TRUE_REWARD,
        "rm_heldout_pair_accuracy": round(accuracy, 4),
        "rm_true_reward_pearson": round(torch.corrcoef(torch.stack([scores, true]))[0, 1].item(), 4),
    }


# --- the build --------------------------------------------------------------------------------


def _build_world(root: Path, seed: int, log: Log) -> None:
    started = time.perf_counter()
    rng = random.Random(seed)
    with _build_settings(seed):
        log("training the tokenizer")
        tokenizer = train_tokenizer(tiny_task.tokenizer_corpus(rng, 4000))
        save_tokenizer(tokenizer, root / "tokenizer")

        log(f"SFT of a {POLICY_SIZE['hidden']}-wide, {POLICY_SIZE['layers']}-layer Llama")
        policy = build_random_causal_lm("llama", tokenizer, seed, **POLICY_SIZE)
        sft_loss = train_sft(policy, tokenizer, rng, log)
        policy.save_pretrained(root / "policy")
        shutil.copytree(root / "tokenizer", root / "policy", dirs_exist_ok=True)
        log("writing the policy as a Megatron-Core distributed checkpoint too")
        save_megatron_checkpoint(policy, AutoTokenizer.from_pretrained(root / "policy"), root / "policy_megatron")

        log("Bradley-Terry training of the reward model")
        reward_model = reward_model_from_policy(policy)
        rm_loss = train_reward_model(reward_model, tokenizer, rng, log)
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
        "preference": "rlsteps.tiny_task.true_reward: +1 for naming the prompt's noun, +0.5 per distinct "
        f"positive adjective (at most 4), -0.5 per negative adjective; best {tiny_task.BEST_TRUE_REWARD}",
        "sizes": {
            "vocab": len(tokenizer),
            "policy_params": sum(p.numel() for p in policy.parameters()),
            "reward_model_params": sum(p.numel() for p in reward_model.parameters()),
            "train_prompts": len(train),
            "val_prompts": len(val),
        },
        "recipe": {"policy": POLICY_SIZE, "sft": SFT, "reward_model": RM, "build_threads": BUILD_THREADS},
        "final_loss": {"sft": sft_loss, "reward_model": rm_loss},
        "quality": quality,
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    (root / "world.json").write_text(json.dumps(metadata, indent=2) + "\n")
    (root / "README.md").write_text(_readme(metadata))
    log(f"built in {metadata['build_seconds']} s: {json.dumps(quality)}")


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def _readme(metadata: dict) -> str:
    return (
        f"# rlsteps tiny world {metadata['version']} (seed {metadata['seed']})\n\n"
        f"{metadata['task']}\n\nHidden preference: {metadata['preference']}.\n\n"
        "Folders: `tokenizer/`, `policy/` (LlamaForCausalLM after SFT), `policy_megatron/` (the same\n"
        "policy as a Megatron-Core distributed checkpoint), `reward_model/`\n"
        "(LlamaForSequenceClassification, one label, Bradley-Terry), all Hugging Face save_pretrained\n"
        "with safetensors. Prompts: `train.jsonl`, `val.jsonl`. The reward model scores\n"
        "`rlsteps.engine.rewards.text.reward_input_text(chat_prompt, response, eos_token)`.\n\n"
        f"```json\n{json.dumps({k: metadata[k] for k in ('sizes', 'quality', 'build_seconds')}, indent=2)}\n```\n"
    )
