"""The verifiable example learns: SmolLM2-135M-Instruct, trained by rl/reinforce -c verifiable (REINFORCE/RLOO on
exact match with the prompt's one-word answer), answers more of the held-out questions right, greedy, and still
speaks: answers that end, short, in English words.

The policy is the SmolLM2 Hugging Face folder the vLLM tests build (tests/vllm_judge.smollm2_hf: without the vLLM
environment this skips, unless RLSTEPS_REQUIRE_VLLM=1). Accuracy is the run's own greedy validation
(val/reward/exact_match over the 64 validation prompts); the speech is read from the trained policy itself
(checkpoint_hf output, Hugging Face generate), beside the same figures for the policy it started from.
"""

from __future__ import annotations

import json
import re

import pytest

from rlsteps.engine.rewards.verifiable import exact_match, one_word
from rlsteps.examples import DATA
from run_helpers import FAST, rlsteps, series

STEPS = 10
MAX_NEW_TOKENS = 8
MARGIN = 0.15  # greedy exact match on 64 held-out prompts, last validation over the first
ENGLISH = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\- ]*[.!]?")


def speech(model_dir, rows: list[dict]) -> dict[str, float]:
    """Greedy answers of a Hugging Face folder to the rows: exact match, one word, ended, English, tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = [tokenizer.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True) for r in rows]
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        output = model.generate(**encoded, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    figures = {"exact_match": 0.0, "one_word": 0.0, "ended": 0.0, "english": 0.0, "tokens": 0.0}
    for row, ids in zip(rows, output[:, encoded.input_ids.shape[1] :]):
        response = tokenizer.decode(ids, skip_special_tokens=True)
        ids = ids.tolist()
        ended = tokenizer.eos_token_id in ids
        tokens = ids.index(tokenizer.eos_token_id) if ended else len(ids)  # the answer's tokens, its end not counted
        figures["exact_match"] += exact_match(row["messages"], response, row["answer"]) or 0.0
        figures["one_word"] += one_word(row["messages"], response)
        figures["ended"] += ended
        figures["english"] += bool(ENGLISH.fullmatch(response.strip()))
        figures["tokens"] += tokens
    return {name: value / len(rows) for name, value in figures.items()}


@pytest.mark.slow
@pytest.mark.skip(
    reason="the verifiable configs do not raise greedy accuracy yet: rl/reinforce -c verifiable went 0.27 -> 0.27 -> "
    "0.23 over 10 steps, its answers drifting from one word towards sentences (benchmarks/README.md); enable this "
    "once a config does"
)
def test_reinforce_on_the_verifiable_example_answers_more_questions_right_and_stays_sane(tmp_path):
    from vllm_judge import smollm2_hf

    policy = smollm2_hf()
    run = tmp_path / "run"
    result = rlsteps(
        "run",
        "rl/reinforce",
        "-c",
        "verifiable",
        f"inputs.policy={policy}",
        f"output.dir={run}",
        "output.type=checkpoint_hf",
        f"train.max_steps={STEPS}",
        f"validation.interval={STEPS}",  # before the first step and after the last
        *FAST,
        cwd=tmp_path,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy = series(run, "val/reward/exact_match")
    assert len(accuracy) == 2, accuracy
    assert accuracy[-1] >= accuracy[0] + MARGIN, accuracy
    assert series(run, "val/fraction_ended")[-1] >= 0.9
    assert series(run, "val/one_word")[-1] >= series(run, "val/one_word")[0] - 0.05

    rows = [json.loads(line) for line in DATA["verifiable_val"].read_text().splitlines()]
    before, after = speech(policy, rows), speech(run / "policy", rows)
    assert after["exact_match"] >= before["exact_match"] + MARGIN, (before, after)
    assert after["ended"] >= max(0.9, before["ended"] - 0.05), (before, after)  # answers end within 8 tokens
    assert after["english"] >= max(0.9, before["english"] - 0.05), (before, after)  # words, not symbols or noise
    assert after["tokens"] <= 5, (before, after)  # a word, not a ramble
