"""eval/policy against a direct computation: on the verifiable example (SmolLM2-135M-Instruct, the held-out
questions), the step's greedy responses, exact-match accuracy and pass@k at greedy settings are what transformers'
own `generate` gives, scored by the same function and the pass@k formula by hand."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlsteps.engine.rewards.verifiable import exact_match
from rlsteps.examples import example_path
from run_helpers import rlsteps
from vllm_judge import smollm2_hf

pytestmark = pytest.mark.slow
PROMPTS, SAMPLES, NEW_TOKENS = 24, 2, 8


def direct_greedy(model_dir, rows: list[dict]) -> list[str]:
    """Each question answered by transformers' generate, greedy, from the chat template's rendering."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    answers = []
    for row in rows:
        ids = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
            )
        answers.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return answers


def test_accuracy_and_pass_at_k_equal_a_direct_computation_with_generate(tmp_path):
    model_dir = smollm2_hf()
    rows = [json.loads(line) for line in example_path("verifiable_val").read_text().splitlines()][:PROMPTS]
    done = rlsteps(
        "run", "eval/policy", "-c", "verifiable", f"inputs.policy={model_dir}", f"output.dir={tmp_path / 'run'}",
        f"eval.num_prompts={PROMPTS}", f"eval.samples_per_prompt={SAMPLES}", "eval.pass_k=[1,2]",
        "generation.sampling.temperature=0", "generation.backend=builtin", "run.num_threads=2", "run.device=cpu",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "results" / "policy.jsonl").read_text().splitlines()]
    report = json.loads((tmp_path / "run" / "report" / "report.json").read_text())

    answers = direct_greedy(model_dir, rows)
    assert [r["greedy"]["response"] for r in records] == answers
    assert [s["response"] for r in records for s in r["samples"]] == [a for a in answers for _ in range(SAMPLES)]
    correct = [exact_match(row["messages"], a, answer=row["answer"]) for row, a in zip(rows, answers)]
    accuracy = sum(correct) / PROMPTS
    assert 0 < accuracy < 1  # the example tells right from wrong answers here
    source = report["sources"]["exact_match"]
    assert source["accuracy"]["policy"]["mean"] == pytest.approx(accuracy)
    assert source["greedy"]["policy"]["mean"] == pytest.approx(accuracy)
    # k identical samples per question: pass@k = 1 - C(n-c, k)/C(n, k) with c = n or 0, the greedy accuracy
    assert source["pass_at_k"]["1"]["policy"]["mean"] == pytest.approx(accuracy)
    assert source["pass_at_k"]["2"]["policy"]["mean"] == pytest.approx(accuracy)
