"""What reward hacking looks like in a run: measured every step, and said in one line when it shows.

Every step, over all its rollouts:
    train/entropy              the mean over response tokens of -log p(token) under the policy that sampled it (the
                               sampler's own log-probs): at temperature 1 without top-p or top-k, an unbiased estimate
                               of the policy's per-token entropy, in nats
    train/distinct_responses   the mean over prompts of the share of its rollouts that differ from each other
    train/identical_groups     the share of prompts whose rollouts are all one answer, word for word
    (train/response_length, and the KL to the initial policy where the recipe has one, come with the recipe's figures)
Every validation with reward functions (validation.reward_functions):
    val/rank_correlation/<fn>  Spearman's rank correlation of the trained reward with the function, over the samples

A sign (thresholds in logging.reward_hacking): the entropy collapsing (below a share of the first step's), groups of
identical answers, or the trained reward rising on validation while a validation function falls from its best. The
run says a sign in one line when it appears, with two samples and the remedies, ("raise the KL penalty, lower the
learning rate, or add reward clipping"), and writes it to reward_hacking.jsonl, which the end summary repeats.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from rlsteps.contract.config import RewardHackingConfig
from rlsteps.engine.records.metrics import append_whole, drop_partial_last_line, metric_series, open_records

if TYPE_CHECKING:
    import torch

    from rlsteps.engine.batch import RolloutBatch

log = logging.getLogger("rlsteps.reward_hacking")
RECORD_FILE = "reward_hacking.jsonl"  # {"step", "sign", "line"} a line
QUOTED_CHARACTERS = 80  # of a sample quoted in a line


def rollout_signs(batch: RolloutBatch) -> dict[str, float]:
    """train/entropy, train/distinct_responses and train/identical_groups of a step's rollouts."""
    signs = {}
    if batch.gen_logprobs is not None:
        mask = batch.response_mask()
        tokens = mask.sum().item()
        signs["train/entropy"] = -(batch.gen_logprobs * mask).sum().item() / tokens if tokens else float("nan")
    groups = list(_groups(batch).values())
    signs["train/distinct_responses"] = sum(len(set(g)) / len(g) for g in groups) / len(groups)
    signs["train/identical_groups"] = sum(len(g) > 1 and len(set(g)) == 1 for g in groups) / len(groups)
    return signs


def _groups(batch: RolloutBatch) -> dict[str, list[str]]:
    """The responses of each prompt, in the batch's order."""
    grouped: dict[str, list[str]] = {}
    for prompt_id, text in zip(batch.prompt_ids, batch.response_texts):
        grouped.setdefault(prompt_id, []).append(text)
    return grouped


def rank_correlation(first: list[float], second: list[float]) -> float:
    """Spearman's rank correlation (ties at their mean rank); NaN for fewer than three pairs or a constant side."""
    if len(first) < 3:
        return float("nan")
    a, b = _ranks(first), _ranks(second)
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b))
    spread = math.sqrt(sum((x - mean_a) ** 2 for x in a) * sum((y - mean_b) ** 2 for y in b))
    return cov / spread if spread else float("nan")


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            ranks[i] = (start + end) / 2
        start = end + 1
    return ranks


def validation_correlations(rewards: torch.Tensor, valid: torch.Tensor, functions: dict[str, list]) -> dict:
    """val/rank_correlation/<fn> for each validation function (val/<fn>: a value or None per sample) against the
    trained reward of the samples both scored; none where it is undefined (fewer than three samples, or one side the
    same for all: the tiny SFT policy's greedy answers all score 1.0 at step 0)."""
    correlations = {}
    for key, values in functions.items():
        both = [(float(r), v) for r, ok, v in zip(rewards, valid, values) if ok and v is not None]
        correlation = rank_correlation([r for r, _ in both], [v for _, v in both])
        if not math.isnan(correlation):
            correlations[f"val/rank_correlation/{key.removeprefix('val/')}"] = correlation
    return correlations


@dataclass
class Remedies:
    """The seed's remedies, with this run's keys for each: the KL penalty (None: the recipe has none), the learning
    rate and the reward terms' clip."""

    kl_penalty_key: str | None
    reward_terms: list[str]

    def __str__(self) -> str:
        clips = ", ".join(f"rewards.{name}.clip" for name in self.reward_terms)
        if self.kl_penalty_key is None:
            return f"lower the learning rate (train.lr) or add reward clipping ({clips}); this recipe has no KL penalty"
        return (
            f"raise the KL penalty ({self.kl_penalty_key}), lower the learning rate (train.lr), "
            f"or add reward clipping ({clips})"
        )


@dataclass
class HackingWatch:
    """The signs of one run (main process): fed each step's figures and samples, it says a sign when it appears
    (again after a step without it) and records it. `history`: the run's metrics records so far (a resumed run's)."""

    thresholds: RewardHackingConfig
    remedies: Remedies
    path: Path
    history: list[dict] = field(default_factory=list)
    active: set[str] = field(default_factory=set)

    _file: BinaryIO | None = field(default=None, init=False, repr=False)  # opened at the first sign: none without

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def rollouts(self, step: int, batch: RolloutBatch, signs: dict[str, float]) -> None:
        """A step's rollouts and their signs (rollout_signs)."""
        self.history.append({"step": step, **signs})
        quotes = _repeated_answers(batch)
        self._sign(step, "entropy", self._entropy_collapse(), quotes)
        identical, most = signs["train/identical_groups"], self.thresholds.max_identical_groups
        groups = (
            f"groups of identical answers: every rollout of {identical:.0%} of this step's prompts said the same "
            f"(logging.reward_hacking.max_identical_groups {most:g})"
        )
        self._sign(step, "identical answers", groups if identical >= most else None, quotes)

    def validation(self, step: int, samples: list[dict], figures: dict[str, float], functions: list[str]) -> None:
        """A validation's figures and samples (records with "response", "reward" and each val/<fn>)."""
        self.history.append({"step": step, **figures})
        for key in functions:
            self._sign(step, f"diverging {key}", self._diverging(key), _most_apart(samples, key))

    def _entropy_collapse(self) -> str | None:
        """Why the latest step's entropy is a collapse, or None."""
        _, entropies = metric_series(self.history, "train/entropy")
        share = self.thresholds.min_entropy_share
        if not entropies or entropies[0] <= 0 or entropies[-1] >= share * entropies[0]:
            return None
        first, now = entropies[0], entropies[-1]
        return (
            f"the policy's entropy collapsing: {now:.3g} nats a token, {now / first:.0%} of the first step's "
            f"{first:.3g} (logging.reward_hacking.min_entropy_share {share:g})"
        )

    def _diverging(self, key: str) -> str | None:
        """Why the trained reward and `key` diverge at the latest validation, or None."""
        points = [r for r in self.history if r.get(key) is not None and r.get("val/reward_mean") is not None]
        if len(points) < 2:
            return None
        best, now = max(points, key=lambda r: r[key]), points[-1]
        allowed = self.thresholds.max_validation_fall * max(abs(best[key] - points[0][key]), abs(best[key]), 1e-12)
        if best[key] - now[key] <= allowed or now["val/reward_mean"] <= best["val/reward_mean"]:
            return None
        fall = self.thresholds.max_validation_fall
        correlation = now.get(f"val/rank_correlation/{key.removeprefix('val/')}")  # absent where undefined
        ranks = f", rank correlation {correlation:.2f}" if correlation is not None else ""
        return (
            f"the trained reward rising while {key} falls: val/reward_mean {best['val/reward_mean']:.4g} -> "
            f"{now['val/reward_mean']:.4g}, {key} {best[key]:.4g} -> {now[key]:.4g} since step {best['step']}{ranks} "
            f"(logging.reward_hacking.max_validation_fall {fall:g})"
        )

    def _sign(self, step: int, sign: str, cause: str | None, quotes: list[str]) -> None:
        """Say and record a sign that appears (cause: why it is present; None: absent), once while it stays."""
        if cause is None:
            self.active.discard(sign)
            return
        if sign in self.active:
            return
        self.active.add(sign)
        quoted = " / ".join(quotes[:2]) or "no sample"
        line = f"reward hacking? step {step}: {cause}; e.g. {quoted}; {self.remedies}"
        log.warning("%s", line)
        if self._file is None:
            drop_partial_last_line(self.path)
            self._file = open_records(self.path)
        append_whole(self._file, json.dumps({"step": step, "sign": sign, "line": line}, ensure_ascii=False) + "\n")


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return json.dumps(text if len(text) <= QUOTED_CHARACTERS else text[: QUOTED_CHARACTERS - 3] + "...")


def _repeated_answers(batch: RolloutBatch) -> list[str]:
    """The most said answer of each of the two prompts whose rollouts differ least, with how many of them said it."""
    alike = sorted(_groups(batch).items(), key=lambda item: len(set(item[1])) / len(item[1]))[:2]
    quotes = []
    for prompt_id, texts in alike:
        text, said = Counter(texts).most_common(1)[0]
        quotes.append(f"{_quote(text)} ({said} of the {len(texts)} rollouts of {prompt_id})")
    return quotes


def _most_apart(samples: list[dict], key: str) -> list[str]:
    """The two answers the trained reward ranks highest above where `key` ranks them."""
    distinct = {s["response"]: s for s in samples if s.get("valid", True) and s.get(key) is not None}
    scored = list(distinct.values())  # one sample of each answer
    if not scored:
        return []
    rewards, values = _ranks([s["reward"] for s in scored]), _ranks([s[key] for s in scored])
    apart = sorted(range(len(scored)), key=lambda i: values[i] - rewards[i])[:2]
    name = key.removeprefix("val/")
    return [f"{_quote(scored[i]['response'])} (reward {scored[i]['reward']:.3g}, {name} {scored[i][key]:.3g})"
            for i in apart]  # fmt: skip


def recorded_signs(run_dir: Path) -> list[str]:
    """The lines of the signs the run said (for its end summary)."""
    path = Path(run_dir) / RECORD_FILE
    if not path.is_file():
        return []
    lines = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(text)["line"])
        except (ValueError, KeyError):
            continue  # a torn line
    return lines
