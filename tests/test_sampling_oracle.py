"""Temperature, top-k and top-p judged by vLLM: the built-in sampler draws from the distribution vLLM draws from.

tests/sampling_oracle_check.py runs in the vLLM environment (.venv-vllm, tests/make_vllm_env.sh) and measures, for
the tiny policy, two prompts and four sampling settings (top-k, top-p, both at temperature 0.6, top-p at 1.7):
vLLM's own filtered distribution of the next token (its engine's processed log-probs of the whole vocabulary), the
built-in sampler's (its sampling function at 2**16 evenly spaced uniform numbers), and 2000 one-token rollouts of
each backend, one seed a row. Without that environment these tests skip, unless RLSTEPS_REQUIRE_VLLM=1 (CI).

The tolerances are chosen to fail a wrong implementation: `wrong` builds, from the policy's raw logits, what
top-p before temperature, top-k off by one, top-p without the token that crosses p, and top-p before top-k would
sample, and test_the_comparison_tells_each_wrong_order_or_boundary shows that the same measurements reject each.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from vllm_judge import vllm_python

pytestmark = pytest.mark.slow

CHECK = Path(__file__).with_name("sampling_oracle_check.py")
SAMPLES = 2000
EXACT_TOLERANCE = 1e-4  # per token: the grid's resolution (2**-16) plus float32 logits from two forward passes
ACCEPT_P = 1e-4  # a chi-square p-value below this rejects a sample as drawn from vLLM's distribution
REJECT_P = 1e-10  # ... and the measurements must reject every wrong implementation at least this clearly


def filtered(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    *,
    top_p_before_temperature: bool = False,
    k_shift: int = 0,
    keep_crossing: bool = True,
    top_p_before_top_k: bool = False,
) -> torch.Tensor:
    """The distribution [V] fp64 of temperature, then top-k (ties with the k-th kept), then top-p (the smallest set
    of most likely tokens whose probability reaches p: the token that crosses p is kept); the keywords make it wrong
    in one way each."""
    logits = logits.double()
    scaled = logits / temperature
    ranked = logits if top_p_before_temperature else scaled
    k = top_k + k_shift if top_k > 0 else 0
    everything = torch.ones_like(ranked, dtype=torch.bool)
    by_k = ranked >= ranked.topk(k).values[-1] if 0 < k < len(ranked) else everything
    if top_p_before_top_k:
        keep = _nucleus(ranked, top_p, everything, keep_crossing) & by_k
    else:
        keep = _nucleus(ranked, top_p, by_k, keep_crossing)
    return torch.where(keep, scaled, -math.inf).softmax(-1)


def _nucleus(logits: torch.Tensor, p: float, allowed: torch.Tensor, keep_crossing: bool) -> torch.Tensor:
    if p >= 1.0:
        return allowed
    probs, order = torch.where(allowed, logits, -math.inf).softmax(-1).sort(descending=True)
    keep_sorted = (probs.cumsum(0) - probs < p) if keep_crossing else (probs.cumsum(0) <= p)
    keep_sorted[0] = True
    keep = torch.zeros_like(allowed)
    keep[order] = keep_sorted
    return keep & allowed


WRONG = {
    "top-p before temperature": dict(top_p_before_temperature=True),
    "top-k keeps k+1": dict(k_shift=1),
    "top-k keeps k-1": dict(k_shift=-1),
    "top-p drops the token that crosses p": dict(keep_crossing=False),
    "top-p before top-k": dict(top_p_before_top_k=True),
}


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of `counts` [V] against `probs` [V]: tokens expected fewer than 5 times pooled into
    one bin; a sample of a token of probability 0 gives 0."""
    expected = probs * counts.sum()
    if counts[probs == 0].sum() > 0:
        return 0.0
    big = expected >= 5
    observed, wanted = [counts[big]], [expected[big]]
    if expected[~big].sum() > 0:
        observed.append(counts[~big].sum()[None])
        wanted.append(expected[~big].sum()[None])
    observed, wanted = torch.cat(observed), torch.cat(wanted)
    if len(observed) < 2:
        return 1.0
    statistic = ((observed - wanted) ** 2 / wanted).sum()
    return torch.special.gammaincc(torch.tensor((len(observed) - 1) / 2, dtype=torch.float64), statistic / 2).item()


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


@pytest.fixture(scope="module")
def measured(tiny_world) -> dict:
    python = vllm_python()
    done = subprocess.run(
        [str(python), str(CHECK), str(tiny_world.policy), str(SAMPLES)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    cases = {}
    for key, case in report["cases"].items():
        vocab = len(case["vllm_probs"])
        counts = {}
        for backend in ("vllm", "builtin"):
            row = torch.zeros(vocab, dtype=torch.float64)
            for token, count in case[f"{backend}_counts"].items():
                row[int(token)] = count
            counts[backend] = row
        cases[key] = {
            "params": case["params"],
            "logits": torch.tensor(case["raw_logits"]),
            "vllm": torch.tensor(case["vllm_probs"], dtype=torch.float64),
            "builtin": torch.tensor(case["builtin_probs"], dtype=torch.float64),
            "counts": counts,
        }
    return {"meta": report["meta"], "cases": cases}


def test_vllm_filters_by_temperature_then_top_k_then_top_p_keeping_the_token_that_crosses_p(measured):
    assert measured["meta"]["topk_topp_forward"] == "forward_cpu"  # the sampler vLLM's CPU build runs
    for key, case in measured["cases"].items():
        expected = filtered(case["logits"], **case["params"])
        assert (case["vllm"] - expected).abs().max() < 1e-5, key
        assert torch.equal(case["vllm"] > 0, expected > 0), key


def test_the_builtin_sampler_draws_from_the_distribution_vllm_draws_from(measured):
    for key, case in measured["cases"].items():
        assert torch.equal(case["builtin"] > 0, case["vllm"] > 0), key  # the same tokens kept
        assert (case["builtin"] - case["vllm"]).abs().max() < EXACT_TOLERANCE, key


def test_rollouts_of_both_backends_follow_vllms_filtered_distribution(measured):
    for key, case in measured["cases"].items():
        for backend, counts in case["counts"].items():
            assert counts.sum() == SAMPLES
            assert counts[case["vllm"] == 0].sum() == 0, (key, backend)  # nothing a filter dropped is ever drawn
            assert chi_square_p(counts, case["vllm"]) > ACCEPT_P, (key, backend)


def test_the_comparison_tells_each_wrong_order_or_boundary(measured):
    """Each wrong implementation changes some case's distribution by a total variation of 0.03 or more, and there
    the same measurements reject it: the exact comparison by far more than its tolerance, the rollouts of both
    backends by a chi-square p-value below 1e-10."""
    for name, wrongly in WRONG.items():
        told = []
        for key, case in measured["cases"].items():
            wrong = filtered(case["logits"], **case["params"], **wrongly)
            if total_variation(wrong, case["vllm"]) < 0.03:
                continue
            assert (case["builtin"] - wrong).abs().max() > 100 * EXACT_TOLERANCE, (name, key)
            assert all(chi_square_p(counts, wrong) < REJECT_P for counts in case["counts"].values()), (name, key)
            told.append(key)
        assert told, f"no case tells '{name}' from vLLM's sampling"
