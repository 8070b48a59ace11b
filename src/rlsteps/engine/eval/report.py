"""An eval's figures, from its per-prompt results: for every per-response reward term the greedy mean (policy,
baseline and their paired difference, each with its bootstrap interval, the gains, losses and the sign test), the
sampled mean, and for the terms that decide correctness the greedy accuracy and pass@k; for the judge the win rate of
the policy over the baseline (and the other way round, and by the side shown first), its sign test, the position
and contradiction rates. Pure: a dict in, a dict out."""

from __future__ import annotations

import math
from typing import Any

from rlsteps.engine.eval.stats import (
    mean_interval,
    outcome_scores,
    paired_counts,
    pass_at_k,
    sign_test,
)

SHOWN_PROMPTS = 5  # the prompts with the largest gains and losses named in the report


class Figures:
    """The bootstrap settings every interval of one report shares."""

    def __init__(self, resamples: int, confidence: float, seed: int) -> None:
        self.resamples, self.confidence, self.seed = resamples, confidence, seed

    def interval(self, values: list[float]) -> dict[str, float]:
        return mean_interval(values, self.resamples, self.confidence, self.seed).as_dict()


def source_report(
    name: str,
    policy: list[dict],
    baseline: list[dict] | None,
    figures: Figures,
    correct_at: float | None,
    ks: list[int],
) -> dict[str, Any]:
    """One reward term's figures."""
    report: dict[str, Any] = {}
    if policy and "greedy" in policy[0]:
        report["greedy"] = _greedy(name, policy, baseline, figures)
        if correct_at is not None:
            report["accuracy"] = _sided(policy, baseline, lambda r: _correct(r["greedy"], name, correct_at), figures)
    if policy and policy[0].get("samples"):
        report["sampled"] = _sided(policy, baseline, lambda r: _sample_mean(r, name), figures)
        if correct_at is not None:
            report["pass_at_k"] = {
                str(k): _sided(policy, baseline, lambda r, k=k: _pass(r, name, correct_at, k), figures) for k in ks
            }
    return report


def _greedy(name: str, policy: list[dict], baseline: list[dict] | None, figures: Figures) -> dict[str, Any]:
    report = _sided(policy, baseline, lambda r: r["greedy"]["rewards"].get(name), figures)
    if baseline is None:
        return report
    diffs = {
        p["id"]: p["greedy"]["rewards"][name] - b["greedy"]["rewards"][name]
        for p, b in zip(policy, baseline)
        if p["greedy"]["rewards"].get(name) is not None and b["greedy"]["rewards"].get(name) is not None
    }
    gains, losses, ties = paired_counts(list(diffs.values()))
    ranked = sorted(diffs.items(), key=lambda item: item[1])
    report["difference"] = {
        **figures.interval(list(diffs.values())),
        "gains": gains,
        "losses": losses,
        "ties": ties,
        "sign_test_p": sign_test(gains, losses),
        "largest_gains": [{"id": i, "gain": d} for i, d in reversed(ranked[-SHOWN_PROMPTS:]) if d > 0],
        "largest_losses": [{"id": i, "gain": d} for i, d in ranked[:SHOWN_PROMPTS] if d < 0],
    }
    return report


def _sided(policy: list[dict], baseline: list[dict] | None, value: Any, figures: Figures) -> dict[str, Any]:
    """The interval of a per-prompt value for the policy, and for the baseline where there is one (None values out)."""
    sides = {"policy": policy} if baseline is None else {"policy": policy, "baseline": baseline}
    return {
        side: figures.interval([v for v in map(value, records) if v is not None]) for side, records in sides.items()
    }


def _correct(row: dict, name: str, correct_at: float) -> float:
    reward = row["rewards"].get(name)
    return float(reward is not None and reward >= correct_at)


def _sample_mean(record: dict, name: str) -> float | None:
    values = [s["rewards"].get(name) for s in record["samples"]]
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def _pass(record: dict, name: str, correct_at: float, k: int) -> float:
    samples = record["samples"]
    return pass_at_k(len(samples), int(sum(_correct(s, name, correct_at) for s in samples)), k)


def judge_report(records: list[dict], figures: Figures) -> dict[str, Any]:
    """The judge's win rate of the policy over the baseline, both ways round, and what its verdicts say of it."""
    outcomes = [r["outcome"] for r in records]
    wins, losses, ties = (outcomes.count(o) for o in ("win", "loss", "tie"))
    win_rate = figures.interval(outcome_scores(wins, losses, ties))
    verdicts = [v for r in records for v in r["verdicts"] if v["outcome"] == "ok"]
    decisive = [v for v in verdicts if v["winner"] != "tie"]
    first_won = [(v["winner"] == "policy") == v["policy_first"] for v in decisive]
    return {
        "win_rate": win_rate,
        "baseline_win_rate": _flipped(win_rate),
        "wins": wins,
        "losses": losses,
        "ties": ties,
        "failed": outcomes.count("failed"),
        "sign_test_p": sign_test(wins, losses),
        "win_rate_policy_shown_first": figures.interval(_verdict_scores(verdicts, shown_first=True)),
        "win_rate_policy_shown_second": figures.interval(_verdict_scores(verdicts, shown_first=False)),
        "first_position_rate": sum(first_won) / len(first_won) if first_won else math.nan,
        "contradiction_rate": sum(v["contradiction"] for v in verdicts) / len(verdicts) if verdicts else math.nan,
        "verdicts": len(verdicts),
    }


def _flipped(estimate: dict[str, float]) -> dict[str, float]:
    """The baseline's win rate over the policy: 1 - the policy's, its interval mirrored."""
    return {**estimate, "mean": 1 - estimate["mean"], "low": 1 - estimate["high"], "high": 1 - estimate["low"]}


def _verdict_scores(verdicts: list[dict], shown_first: bool) -> list[float]:
    chosen = [v["winner"] for v in verdicts if v["policy_first"] == shown_first]
    return outcome_scores(chosen.count("policy"), chosen.count("baseline"), chosen.count("tie"))


def build_report(
    cfg: Any, policy: list[dict], baseline: list[dict] | None, judged: list[dict] | None, terms: list[str]
) -> dict[str, Any]:
    """The report's JSON: the settings it was made at and every source's figures."""
    figures = Figures(cfg.eval.bootstrap_resamples, cfg.eval.confidence, cfg.seed)
    sampling = cfg.generation.sampling
    return {
        "prompts": len(policy),
        "inputs": {name: ref for name, ref in cfg.inputs.model_dump().items() if ref},
        "settings": {
            "greedy": cfg.eval.greedy,
            "samples_per_prompt": cfg.eval.samples_per_prompt,
            "sampling": sampling.model_dump(),
            "pass_k": list(cfg.eval.pass_k),
            "correct_at": dict(cfg.eval.correct_at),
            "bootstrap_resamples": cfg.eval.bootstrap_resamples,
            "confidence": cfg.eval.confidence,
        },
        "sources": {
            name: source_report(name, policy, baseline, figures, cfg.eval.correct_at.get(name), list(cfg.eval.pass_k))
            for name in terms
        },
        **({"judge": judge_report(judged, figures)} if judged is not None else {}),
    }
