"""The tiny world's two trainings: SFT of the policy and Bradley-Terry training of the reward model."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from rlsteps.engine.rewards.text import reward_input_text
from rlsteps.tiny import task as tiny_task
from rlsteps.tiny.hyperparameters import RM, SFT
from rlsteps.tiny.preferences import NOUN_FIRST, draw_wide, preference_pairs, tie_pairs
from rlsteps.tiny.tokenizer import chat_prompt, word_token

Log = Callable[[str], None]


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


@dataclass(frozen=True)
class RepeatUnlikelihood:
    """The policy SFT's unlikelihood term on the adjectives a response has already said (repeat_unlikelihood_loss):
    its weight, and how many rows a step of answers in any order (tiny_task.unordered_examples) it reads beside the
    SFT data's, drawn from their own rng so the SFT data's draws (and all a build draws after them) stay as they were.
    Those rows are for this term alone: the SFT data says its adjectives in alphabetical order and no NLL is taken on
    others, but a policy moved by RL says them in any order, and after an adjective the SFT data never goes on from
    ("wonderful", last in that order) NLL and the term on the SFT data alone left the policy saying it again 40% of
    the time (benchmarks/tiny_repeat_share.py)."""

    weight: float
    unordered_rows: int = 0
    rng: random.Random | None = None


def train_sft(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    rng: random.Random,
    log: Log,
    steps: int,
    repeat_unlikelihood: RepeatUnlikelihood | None = None,
) -> float:
    """Masked next-token NLL on fresh SFT examples each of `steps` steps, plus the repeat unlikelihood term where one
    is given (on those examples and its own unordered rows); returns the last NLL."""
    optimizer, schedule = _optimizer(policy, SFT["lr"], steps)
    adjectives = adjective_tokens(tokenizer, policy.config.vocab_size)
    policy.train()
    for step in range(1, steps + 1):
        examples = tiny_task.sft_examples(rng, SFT["batch"])
        extra = _unordered_rows(repeat_unlikelihood)
        batch = sft_batch(tokenizer, examples + extra)
        logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, T, V]
        sft_rows = slice(0, len(examples))
        loss = F.cross_entropy(
            logits[sft_rows, :-1].flatten(0, 1), batch["labels"][sft_rows, 1:].flatten(), ignore_index=-100
        )
        total = loss
        if repeat_unlikelihood and repeat_unlikelihood.weight:
            total = loss + repeat_unlikelihood.weight * repeat_unlikelihood_loss(logits, batch, adjectives)
        _step(total, policy, optimizer, schedule)
        if step % 100 == 0 or step == steps:
            log(f"SFT step {step}/{steps}  loss {loss.item():.3f}")
    policy.eval()
    return round(loss.item(), 4)


def _unordered_rows(repeat_unlikelihood: RepeatUnlikelihood | None) -> list[tuple[str, str]]:
    if repeat_unlikelihood is None or not repeat_unlikelihood.unordered_rows:
        return []
    if repeat_unlikelihood.rng is None:
        raise ValueError("unordered rows need their own rng (RepeatUnlikelihood.rng)")
    return tiny_task.unordered_examples(repeat_unlikelihood.rng, repeat_unlikelihood.unordered_rows)


def adjective_tokens(tokenizer: PreTrainedTokenizerFast, vocab: int) -> torch.Tensor:  # [V] bool
    """The task's adjectives as the tokens a response says them with (" bright")."""
    marked = torch.zeros(vocab, dtype=torch.bool)
    marked[[word_token(tokenizer, adjective) for adjective in tiny_task.ADJECTIVES]] = True
    return marked


def repeat_unlikelihood_loss(
    logits: torch.Tensor, batch: dict[str, torch.Tensor], adjectives: torch.Tensor
) -> torch.Tensor:
    """Token-level unlikelihood (Welleck et al., 2019) with the adjectives already said as its negatives: at each
    response position, -sum log(1 - p(c)) over the adjective tokens c the response has said before it (the next
    token itself left out), averaged over the positions. The SFT data never says an adjective twice, but NLL alone
    leaves the one just said a few percent of the chance at each place of a list, and RL, lifting the liked
    adjectives alike, lifts it with them (benchmarks/README.md, tiny_repeat_share.py)."""
    inputs, labels = batch["input_ids"][:, :-1], batch["labels"][:, 1:]  # [B, T-1]: the token at t predicts label t
    said_here = F.one_hot(inputs, len(adjectives)).bool() & adjectives & (batch["labels"][:, :-1] != -100)[..., None]
    said = said_here.cummax(dim=1).values  # [B, T-1, V]: said at or before t, in the response
    scored = labels != -100
    negatives = said & ~F.one_hot(labels.clamp(min=0), len(adjectives)).bool() & scored[..., None]
    probs = logits[:, :-1].float().softmax(-1)
    per_position = -(torch.log1p(-probs.clamp(max=1 - 1e-6)) * negatives).sum(-1)
    return per_position[scored].mean()


def reward_scores(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompts: list[str], responses: list[str]
) -> torch.Tensor:  # [B]
    """Scores of (rendered chat prompt, decoded response) pairs, on exactly the text a server scores."""
    texts = [reward_input_text(p, r, tokenizer.eos_token) for p, r in zip(prompts, responses, strict=True)]
    encoded = tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt")
    return reward_model(**encoded).logits[:, 0]


@torch.no_grad()
def judge_scale(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rng: random.Random, count: int
) -> dict[str, float]:
    """The spread of the reward model's rewards over `count` answers of the wide distribution (about random prompts,
    each with its own chances of a positive adjective and of naming the noun): {"center": mean, "scale": std}, how
    the judge server reads a reward as a score (rlsteps.engine.rewards.judge.scale)."""
    prompts, responses = [], []
    for _ in range(count):
        prompt, noun = tiny_task.sample_prompt(rng)
        prompts.append(chat_prompt(tokenizer, prompt))
        responses.append(tiny_task.render_response(*draw_wide(rng, noun)))
    rewards = reward_scores(reward_model, tokenizer, prompts, responses).double()
    return {"center": round(rewards.mean().item(), 3), "scale": round(rewards.std().item(), 3)}


def train_reward_model(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rng: random.Random, log: Log
) -> float:
    """Bradley-Terry on fresh pairs each step: -log sigmoid(r_chosen - r_rejected) for a preference pair, and for a
    tie -(log sigmoid(d) + log sigmoid(-d)) / 2 with d = r_1 - r_2, least where the two score alike (wrong-noun pairs
    alone for the first RM["noun_first_steps"], no ties among them)."""
    optimizer, schedule = _optimizer(reward_model, RM["lr"], RM["steps"])
    reward_model.train()
    for step in range(1, RM["steps"] + 1):
        noun_first = step <= RM["noun_first_steps"]
        ties = [] if noun_first else tie_pairs(rng, RM["tie_pairs"])
        pairs = preference_pairs(rng, RM["batch"] - len(ties), NOUN_FIRST if noun_first else None) + ties
        prompts, first, second = zip(*pairs)
        rendered = [chat_prompt(tokenizer, p) for p in prompts]
        scores = reward_scores(reward_model, tokenizer, rendered * 2, list(first + second))  # [2B]
        margins = torch.tensor(
            [RM["margin_per_reward"] * reward_gap(*pair) for pair in pairs[: len(pairs) - len(ties)]]
        )
        loss = pair_losses(scores[: len(pairs)] - scores[len(pairs) :], margins).mean()
        _step(loss, reward_model, optimizer, schedule)
        if step % 100 == 0 or step == RM["steps"]:
            log(f"reward model step {step}/{RM['steps']}  loss {loss.item():.3f}")
    reward_model.eval()
    return round(loss.item(), 4)


def pair_losses(differences: torch.Tensor, margins: torch.Tensor) -> torch.Tensor:
    """Each pair's loss from its score difference r_first - r_second: -log sigmoid(difference - margin) for the
    preference pairs, one margin each, first; -(log sigmoid(d) + log sigmoid(-d)) / 2 for the ties after them."""
    preferred, tied = differences[: len(margins)], differences[len(margins) :]
    return torch.cat([-F.logsigmoid(preferred - margins), -(F.logsigmoid(tied) + F.logsigmoid(-tied)) / 2])


def reward_gap(prompt: str, chosen: str, rejected: str) -> float:
    """What the two answers' words are worth apart (never below 0), and RM["fault_worth"] more where only the rejected
    answer has a fault: a wrong noun, a broken or repeated word, a list without its "and" costs more than a positive
    adjective gains, or a policy keeps a fault that came with one. Not the strict true reward's gap: it gives a faulty
    answer nothing, so a fault's margin would be the whole worth of the good answer (up to 3.0), and those pairs
    crowded out the rest (one more positive adjective scored higher in only 82% of probes, against 99.6% here)."""
    faulty = bool(tiny_task.faults(prompt, rejected)) and not tiny_task.faults(prompt, chosen)
    words_gap = tiny_task.words_score(prompt, chosen) - tiny_task.words_score(prompt, rejected)
    return max(words_gap, 0.0) + RM["fault_worth"] * faulty


def _step(loss: torch.Tensor, model: PreTrainedModel, optimizer: torch.optim.Optimizer, schedule: LambdaLR) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
