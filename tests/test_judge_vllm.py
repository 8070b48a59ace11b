"""rl/rlhf against a real judge: vLLM's OpenAI server (CPU build) serving SmolLM2-135M-Instruct.

Asked for structured output, the judge's every answer parses and the run completes; asked for free text, the
same judge rambles, and the run stops at its first step with exit 1 and the judge's answers shown, instead of
training on nothing and exiting 0.
"""

import json

import pytest

from run_helpers import FAST, artifact_metadata, rlsteps, run_dir, series
from vllm_judge import SERVED_NAME, smollm2_hf, vllm_judge

pytestmark = pytest.mark.slow

# two prompts of two rollouts per step: two comparisons a step, which a 135M judge answers in seconds on a CPU
SMALL = [
    "rollout.prompts_per_step=2", "rollout.num_rollouts_per_prompt=2", "validation.interval=0",
    "checkpoint.interval=0", "judge.max_tokens=64", "judge.temperature=0", *FAST,
]  # fmt: skip


PROMPTS_4 = "rollout.prompts_per_step=4"  # later overrides win


@pytest.fixture(scope="module")
def judge_url(tiny_world, tmp_path_factory):
    with vllm_judge(smollm2_hf(), tmp_path_factory.mktemp("vllm") / "vllm.log") as url:
        yield url


def _judge_options(url: str) -> list[str]:
    return [f"judge.url={url}", f"judge.model={SERVED_NAME}"]


def test_structured_output_makes_every_answer_parse_and_the_run_completes(judge_url, tmp_path):
    options = [*_judge_options(judge_url), "train.max_steps=3"]
    done = rlsteps("run", "rl/rlhf", "-c", "tiny", *options, *SMALL, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(tmp_path, "rl_rlhf")
    assert series(run, "judge/comparisons") == [2.0, 2.0, 2.0]
    assert series(run, "judge/parse_failures") == [0.0, 0.0, 0.0]
    assert series(run, "train/steps_without_update") == [0, 0, 0]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    answers = [a for s in samples for a in s["judge"]]
    assert len(samples) == 12 and answers and all(a["outcome"] == "ok" for a in answers)
    assert all(set(json.loads(a["answer"])) == {"score_1", "score_2", "ranking"} for a in answers)
    assert samples[0]["prompt"][0]["role"] == "user" and "<|" not in samples[0]["prompt"][0]["content"]
    assert artifact_metadata(run)["counters"]["step"] == 3


def test_free_text_answers_that_do_not_parse_stop_the_run_with_the_answers_shown(judge_url, tmp_path):
    options = [*_judge_options(judge_url), "judge.structured_output=none", "judge.max_retries=0"]
    # four comparisons at the first step: the default limit (more than half unparsable) needs three to fail
    done = rlsteps("run", "rl/rlhf", "-c", "tiny", *options, "train.max_steps=3", *SMALL, PROMPTS_4, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the judge's answers did not parse in" in done.stderr and "judge.max_parse_failure_rate=0.5" in done.stderr
    assert "in the judge's answer:" in done.stderr  # the answers themselves are quoted
    assert "Traceback" not in done.stderr
    assert not (run_dir(tmp_path, "rl_rlhf") / "policy").exists()
