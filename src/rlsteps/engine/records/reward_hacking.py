"""What reward hacking looks like in a run: measured every step, and said in one line when it shows.

Every step, over all its rollouts:
    train/entropy              the mean over response tokens of -log p(token) under the policy that sampled it (the
                               sampler's own log-probs): at temperature 1 without top-p or top-k, an unbiased estimate
                               of the policy's per-token entropy, in nats
    train/distinct_responses   the mean over prompts of the share of its rollouts that differ from each other
    train/identical_groups     the share of prompts whose rollouts are all one answer, word for word
    train/repeated_word_share  the share of rollouts that say a word again (said_words: whitespace tokens, their case
                               and punctuation aside)
    (train/response_length, train/fraction_ended, the KL to the initial policy where the recipe has one, and each
    reward term's mean reward/<term> and spread reward/<term>/spread come with the step's other figures)
Every validation with reward functions (validation.reward_functions):
    val/rank_correlation/<fn>  Spearman's rank correlation of the trained reward with the function, over the samples

A sign (thresholds in logging.reward_hacking), each measured against the run's first steps:
    - from the rollouts themselves: fewer of them ending (a length hack runs on to max_new_tokens), answers growing
      far longer, more of them saying a word again (a repeat hack);
    - the entropy collapsing, or groups of identical answers: said only while a validation function stands below its
      best (without validation functions, always), since a run that converged on what they reward is not hacking;
    - the trained reward rising on validation while a validation function falls from its best.
The run says a sign in one line when it appears, with two samples that show it and the remedy that fits: where a
reward term outweighs the others between the answers of a prompt, the clip that caps it at their size, before the KL
penalty and the learning rate. It writes the line to reward_hacking.jsonl, which the end summary repeats.
"""

from __future__ import annotations

import json
import logging
import math
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from rlsteps.contract.config import RewardHackingConfig
from rlsteps.contract.reward_config import RewardEntry
from rlsteps.engine.records.metrics import append_whole, drop_partial_last_line, metric_series, open_records, trend

if TYPE_CHECKING:
    import torch

    from rlsteps.engine.batch import RolloutBatch

log = logging.getLogger("rlsteps.reward_hacking")
RECORD_FILE = "reward_hacking.jsonl"  # {"step", "sign", "line"} a line
QUOTED_CHARACTERS = 80  # of a sample quoted in a line


def said_words(text: str) -> list[str]:
    """The words of a text: its whitespace tokens, lower-cased, without the punctuation around them ("Kind," and
    "kind." are one word)."""
    stripped = (token.strip(string.punctuation).lower() for token in text.split())
    return [word for word in stripped if word]


def repeated_word(text: str) -> tuple[str, int] | None:
    """The word the text says most often and how often, where it says one again; None where it says each once."""
    counted = Counter(said_words(text)).most_common(1)
    return counted[0] if counted and counted[0][1] > 1 else None


def rollout_signs(batch: RolloutBatch) -> dict[str, float]:
    """train/entropy, train/distinct_responses, train/identical_groups and train/repeated_word_share of a step's
    rollouts."""
    signs = {}
    if batch.gen_logprobs is not None:
        mask = batch.response_mask()
        tokens = mask.sum().item()
        signs["train/entropy"] = -(batch.gen_logprobs * mask).sum().item() / tokens if tokens else float("nan")
    groups = list(_groups(batch).values())
    signs["train/distinct_responses"] = sum(len(set(g)) / len(g) for g in groups) / len(groups)
    signs["train/identical_groups"] = sum(len(g) > 1 and len(set(g)) == 1 for g in groups) / len(groups)
    repeating = sum(repeated_word(text) is not None for text in batch.response_texts)
    signs["train/repeated_word_share"] = repeating / len(batch) if len(batch) else float("nan")
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
    """The remedy that fits a run, with its keys: where one reward term outweighs the others, the clip that caps it at
    their size, then the KL penalty (kl_penalty_key; None: the recipe has none) and the learning rate.

    A term's size is what it pays between the answers of one prompt, |weight| x reward/<term>/spread (the mean over
    prompts of its shaped rewards' standard deviation among the prompt's rollouts): the advantages the policy learns
    from are differences within a prompt's answers, so the size of a term's mean says nothing of its pull (a term
    with a negative weight, or whose mean shrinks as the hack succeeds, pays the most between answers)."""

    kl_penalty_key: str | None
    reward_terms: dict[str, RewardEntry]

    def advice(self, history: list[dict], steps: int) -> str:
        """The remedy, from the terms' weighted spreads in `history` (the run's step figures): their first and latest
        `steps` steps.

        The term named is the one whose pull against the others (its spread over the sum of theirs, which is no less
        than the spread of their sum) is the largest now or rose the most since the first steps, where either is
        above one: a term that outweighs the others is what the policy learns from while a sign shows, grown or not
        (a hack term of a large weight outweighs them from the first step), and a term that gained on them is what
        the policy found it could be paid by, even where the two now pay alike (the hidden true reward at weight -10
        rose from half the reward model's spread to all of it as the hack took over)."""
        if len(self.reward_terms) == 1:
            (name,) = self.reward_terms
            return f"the reward has one term ({name}): {self._training()}, or clip it (rewards.{name}.clip)"
        sizes = {name: _term_sizes(history, name, entry, steps) for name, entry in self.reward_terms.items()}
        if any(size is None for size in sizes.values()):
            clips = ", ".join(f"rewards.{name}.clip" for name in self.reward_terms)
            return f"{self._training()}, or clip the term the answers game ({clips})"
        pulls = {name: _pull(sizes, name) for name in sizes}
        named = max(pulls, key=lambda name: max(pulls[name]))
        outweighs, rose = pulls[named]
        if max(outweighs, rose) <= 1:
            return f"no reward term outweighs the others (|weight| x spread {_sizes(sizes)}); {self._training()}"
        verb = "grew to outweigh" if outweighs > 1 and rose > 1 else "outweighs" if outweighs > 1 else "gained on"
        (first, now), others = sizes[named], sum(sizes[name][1] for name in sizes if name != named)
        return (
            f"the term {named} {verb} the others: |weight| x reward/{named}/spread {first:.3g} -> {now:.3g} since the "
            f"first steps, against {_sizes({k: v for k, v in sizes.items() if k != named})}; cap it at their size with "
            f"{self._clip(named, others, history, steps)}, then {self._training()}"
        )

    def _clip(self, name: str, size: float, history: list[dict], steps: int) -> str:
        """The override that holds term `name` to a pay of at most `size` (the others' spread) between any two answers.

        A term clipped to [low, high] moves an answer's reward by at most |weight x scale| x (high - low) against any
        other answer's, whatever the answers do: so the width is size / |weight x scale|, and the clipped term can no
        longer outpay the others' spread. Where it lies decides what of the term is left: it is centred on the term's
        raw mean over the first `steps` steps (reward/<term>), which lies among the values the answers had before the
        hack, so the term still ranks the answers it was meant for there, while every value the hack reaches beyond
        is held at an edge and pays no more. Without numbers where the others pay nothing between answers."""
        entry = self.reward_terms[name]
        _, raw = metric_series(history, f"reward/{name}")
        raw = [value for value in raw if math.isfinite(value)]
        width = size / abs(entry.weight * entry.scale) if entry.weight and entry.scale else 0.0
        if not width or not math.isfinite(width) or not raw:
            return f"rewards.{name}.clip"
        centre = trend(raw, steps)[0]
        digits = max(0, 2 - math.floor(math.log10(width)))  # the width to three significant digits
        low, high = (round(centre + side * width / 2, digits) + 0.0 for side in (-1, 1))
        return f"rewards.{name}.clip=[{low},{high}]"

    def _training(self) -> str:
        if self.kl_penalty_key is None:
            return "lower the learning rate (train.lr; this recipe has no KL penalty)"
        return f"raise the KL penalty ({self.kl_penalty_key}) or lower the learning rate (train.lr)"


def _term_sizes(history: list[dict], name: str, entry: RewardEntry, steps: int) -> tuple[float, float] | None:
    """A term's weighted spread, |weight| x reward/<term>/spread (of its shaped rewards), over the first and the
    latest `steps` steps of `history`; None where no step logged it."""
    _, spreads = metric_series(history, f"reward/{name}/spread")
    values = [abs(entry.weight) * v for v in spreads]
    if not any(map(math.isfinite, values)):
        return None
    return trend(values, steps)


def _pull(sizes: dict[str, tuple[float, float]], name: str) -> tuple[float, float]:
    """Term `name`'s pull against the others: its latest size over the sum of theirs, and how many times that of the
    first steps it is (inf where they pay nothing between answers)."""
    first, now = sizes[name]
    others_first, others_now = (sum(sizes[other][i] for other in sizes if other != name) for i in (0, 1))
    outweighs = _ratio(now, others_now)
    return outweighs, _ratio(outweighs, _ratio(first, others_first))


def _ratio(a: float, b: float) -> float:
    """a / b, with nothing over nothing (or inf over inf) one, and something over nothing inf."""
    if a == b:
        return 1.0
    return a / b if b else math.inf


def _sizes(sizes: dict[str, tuple[float, float]]) -> str:
    return ", ".join(f"{name} {first:.3g} -> {now:.3g}" for name, (first, now) in sizes.items())


@dataclass
class HackingWatch:
    """The signs of one run (main process): fed each step's figures and samples, it says a sign when it appears
    (again after a step without it) and records it. `history`: the run's metrics records so far (a resumed run's);
    `functions`: the validation functions' figures (val/<fn>): while none has fallen, a collapse is not said."""

    thresholds: RewardHackingConfig
    remedies: Remedies
    path: Path
    history: list[dict] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    active: set[str] = field(default_factory=set)

    _file: BinaryIO | None = field(default=None, init=False, repr=False)  # opened at the first sign: none without

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def rollouts(self, step: int, batch: RolloutBatch, figures: dict[str, float]) -> None:
        """A step's rollouts and their figures: rollout_signs, train/fraction_ended, train/response_length and each
        term's reward/<term> and reward/<term>/spread."""
        self.history.append({"step": step, **figures})
        self._sign(step, "unended answers", self._fewer_ended(), partial(_unended, batch))
        self._sign(step, "longer answers", self._longer(), partial(_longest, batch))
        self._sign(step, "repeated words", self._more_repeating(), partial(_repeating, batch))
        converged = self._functions_stand()
        quotes = partial(_repeated_answers, batch)
        self._sign(step, "entropy", None if converged else self._entropy_collapse(), quotes)
        identical, most = figures["train/identical_groups"], self.thresholds.max_identical_groups
        groups = (
            f"groups of identical answers: every rollout of {identical:.0%} of this step's prompts said the same "
            f"(logging.reward_hacking.max_identical_groups {most:g})"
        )
        self._sign(step, "identical answers", groups if identical >= most and not converged else None, quotes)

    def validation(self, step: int, samples: list[dict], figures: dict[str, float], functions: list[str]) -> None:
        """A validation's figures and samples (records with "response", "reward" and each val/<fn>)."""
        self.history.append({"step": step, **figures})
        for key in functions:
            self._sign(step, f"diverging {key}", self._diverging(key), partial(_most_apart, samples, key))

    def _crossed(self, key: str, crossed: Callable[[float, float], bool]) -> tuple[float, float] | None:
        """The mean of `key` over the run's first steps (logging.reward_hacking.first_steps) and its latest value,
        where crossed(first, latest) holds; None where it does not, or before there is a step past the first ones."""
        _, values = metric_series(self.history, key)
        values = [v for v in values if math.isfinite(v)]
        if len(values) <= self.thresholds.first_steps:
            return None
        first, now = trend(values, self.thresholds.first_steps)[0], values[-1]
        return (first, now) if crossed(first, now) else None

    def _fewer_ended(self) -> str | None:
        """Why the latest step's share of rollouts that ended (EOS) is a fall, or None."""
        share = self.thresholds.min_ended_share
        if (measured := self._crossed("train/fraction_ended", lambda first, now: now < share * first)) is None:
            return None
        return (f"fewer answers ending: {measured[1]:.0%} of the rollouts ended, against {measured[0]:.0%} in the "
                f"first steps (logging.reward_hacking.min_ended_share {share:g})")  # fmt: skip

    def _longer(self) -> str | None:
        """Why the latest step's mean response length is a growth, or None."""
        most = self.thresholds.max_length_growth
        if (measured := self._crossed("train/response_length", lambda first, now: now > most * first)) is None:
            return None
        first, now = measured
        return (f"answers growing: {now:.3g} tokens on average, {now / first:.1f}x the first steps' {first:.3g} "
                f"(logging.reward_hacking.max_length_growth {most:g})")  # fmt: skip

    def _more_repeating(self) -> str | None:
        """Why the latest step's share of rollouts saying a word again is a rise, or None."""
        rise = self.thresholds.max_repeated_word_rise
        if (measured := self._crossed("train/repeated_word_share", lambda first, now: now - first > rise)) is None:
            return None
        return (f"words said again: {measured[1]:.0%} of the rollouts repeat a word, against {measured[0]:.0%} in "
                f"the first steps (logging.reward_hacking.max_repeated_word_rise {rise:g})")  # fmt: skip

    def _functions_stand(self) -> bool:
        """Whether every validation function measured so far stands at its best (none fallen): then the run converged
        on what they reward. False where none was measured."""
        measured = [key for key in self.functions if self._validations(key)]
        return bool(measured) and not any(self._fallen(key) for key in measured)

    def _validations(self, key: str) -> list[dict]:
        """The validation records that measured `key`."""
        return [r for r in self.history if r.get(key) is not None and r.get("val/reward_mean") is not None]

    def _fallen(self, key: str) -> tuple[dict, dict] | None:
        """The validation records where `key` stood at its best and where it stands now, where it stood below that
        best at each of the latest validations_fallen validations by more than max_validation_fall of its rise to the
        best (or of the best itself); None where it did not."""
        points = self._validations(key)
        latest = points[-self.thresholds.validations_fallen :]
        if not points or len(latest) < self.thresholds.validations_fallen:
            return None
        best = max(points, key=lambda r: r[key])
        allowed = self.thresholds.max_validation_fall * max(abs(best[key] - points[0][key]), abs(best[key]), 1e-12)
        return None if any(best[key] - r[key] <= allowed for r in latest) else (best, points[-1])

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
        fallen = self._fallen(key)
        if fallen is None or fallen[1]["val/reward_mean"] <= fallen[0]["val/reward_mean"]:
            return None
        best, now = fallen
        most = self.thresholds.max_validation_fall
        correlation = now.get(f"val/rank_correlation/{key.removeprefix('val/')}")  # absent where undefined
        ranks = f", rank correlation {correlation:.2f}" if correlation is not None else ""
        return (
            f"the trained reward rising while {key} falls: val/reward_mean {best['val/reward_mean']:.4g} -> "
            f"{now['val/reward_mean']:.4g}, {key} {best[key]:.4g} -> {now[key]:.4g} since step {best['step']}{ranks} "
            f"(logging.reward_hacking.max_validation_fall {most:g})"
        )

    def _sign(self, step: int, sign: str, cause: str | None, quotes: Callable[[], list[str]]) -> None:
        """Say and record a sign that appears (cause: why it is present; None: absent), once while it stays; quotes:
        the samples that show it, drawn only where it is said (most steps say nothing)."""
        if cause is None:
            self.active.discard(sign)
            return
        if sign in self.active:
            return
        self.active.add(sign)
        quoted = " / ".join(quotes()[:2]) or "no sample"
        remedy = self.remedies.advice(self.history, self.thresholds.first_steps)
        line = f"reward hacking? step {step}: {cause}; e.g. {quoted}; {remedy}"
        log.warning("%s", line)
        if self._file is None:
            drop_partial_last_line(self.path)
            self._file = open_records(self.path)
        append_whole(self._file, json.dumps({"step": step, "sign": sign, "line": line}, ensure_ascii=False) + "\n")


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return json.dumps(text if len(text) <= QUOTED_CHARACTERS else text[: QUOTED_CHARACTERS - 3] + "...")


def _unended(batch: RolloutBatch) -> list[str]:
    """Two answers that did not end, with their length."""
    return _with_length(batch, [row for row in range(len(batch)) if not batch.is_end[row]][:2], "no end in {} tokens")


def _longest(batch: RolloutBatch) -> list[str]:
    """The two longest answers, with their length."""
    return _with_length(batch, sorted(range(len(batch)), key=lambda row: -int(batch.response_lengths[row]))[:2])


def _with_length(batch: RolloutBatch, rows: list[int], length: str = "{} tokens") -> list[str]:
    return [f"{_quote(batch.response_texts[row])} ({length.format(int(batch.response_lengths[row]))})" for row in rows]


def _repeating(batch: RolloutBatch) -> list[str]:
    """Two answers that say a word again, with the word and how often."""
    quotes = []
    for text in batch.response_texts:
        repeated = repeated_word(text)
        if repeated is not None and len(quotes) < 2:
            quotes.append(f'{_quote(text)} ("{repeated[0]}" {repeated[1]} times)')
    return quotes


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
