"""rl/rlhf against a real judge: vLLM's OpenAI server (CPU build) serving SmolLM2-135M-Instruct.

Asked for structured output, the judge's every answer parses and the run completes; asked for free text, the
same judge rambles, and the run stops at its first step with exit 1 and the judge's answers shown, instead of
training on nothing and exiting 0.

The judge's direction (the score of "response 1" belongs to the first response of the pair) needs a judge that
reads the responses, which SmolLM2-135M does not: it answers the same in either order. A tiny generative judge,
trained on rlsteps' judge prompts (tests/tiny_generative_judge.py) and served by vLLM too, checks it.
"""

import json

import pytest

from rlsteps.engine.rewards.judge.client import JudgeClient
from run_helpers import FAST, artifact_metadata, rlsteps, run_dir, series
from vllm_judge import SERVED_NAME, TINY_JUDGE_NAME, smollm2_hf, tiny_judge, vllm_judge

pytestmark = pytest.mark.slow

# two prompts of two rollouts per step: two comparisons a step, which a 135M judge answers in seconds on a CPU
SMALL = [
    "rollout.prompts_per_step=2", "rollout.num_rollouts_per_prompt=2", "validation.interval=0",
    "checkpoint.interval=0", "judge.max_tokens=64", "judge.temperature=0", *FAST,
]  # fmt: skip


PROMPTS_4 = "rollout.prompts_per_step=4"  # later overrides win


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory):
    # not on tiny_world, a session fixture pytest would build first: the runs below wait on the world's build lock
    # themselves, so the judge's start-up overlaps the build where it is still going on
    with vllm_judge(smollm2_hf(), tmp_path_factory.mktemp("vllm") / "vllm.log") as url:
        yield url


@pytest.fixture(scope="module")
def tiny_judge_url(tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-tiny") / "vllm.log"
    with vllm_judge(tiny_judge(), log, served_name=TINY_JUDGE_NAME, dtype="float32") as url:
        yield url


def _judge_options(url: str) -> list[str]:
    return [f"judge.url={url}", f"judge.model={SERVED_NAME}"]


def test_structured_output_makes_every_answer_parse_and_the_run_completes(judge_url, tmp_path):
    options = [*_judge_options(judge_url), "train.max_steps=2"]  # a step after the first: the run goes on
    done = rlsteps("run", "rl/rlhf", "-c", "tiny", *options, *SMALL, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(tmp_path, "rl_rlhf")
    assert series(run, "judge/comparisons") == [4.0, 4.0]  # two pairs, each shown both ways round
    assert series(run, "judge/parse_failures") == [0.0, 0.0]
    assert len(series(run, "judge/first_position_rate")) == 2 and len(series(run, "judge/contradiction_rate")) == 2
    assert series(run, "train/steps_without_update") == [0, 0]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    answers = [a for s in samples for a in s["judge"]]
    assert len(samples) == 8 and answers and all(a["outcome"] == "ok" for a in answers)
    assert all(set(json.loads(a["answer"])) == {"score_1", "score_2", "ranking"} for a in answers)
    assert samples[0]["prompt"][0]["role"] == "user" and "<|" not in samples[0]["prompt"][0]["content"]
    assert artifact_metadata(run)["counters"]["step"] == 2


def test_free_text_answers_that_do_not_parse_stop_the_run_with_the_answers_shown(judge_url, tmp_path):
    options = [*_judge_options(judge_url), "judge.structured_output=none", "judge.max_retries=0"]
    # eight comparisons at the first step: the default limit (more than half unparsable) needs five to fail
    done = rlsteps("run", "rl/rlhf", "-c", "tiny", *options, "train.max_steps=3", *SMALL, PROMPTS_4, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the judge's answers did not parse in" in done.stderr and "judge.max_parse_failure_rate=0.5" in done.stderr
    assert "in the judge's answer:" in done.stderr  # the answers themselves are quoted
    assert "Traceback" not in done.stderr
    assert not (run_dir(tmp_path, "rl_rlhf") / "policy").exists()


# One response answers the question, the other is nonsense: a judge that reads them prefers the answer. Neither is
# in the tiny judge's training set (tests/tiny_generative_judge.py holds them out).
UNAMBIGUOUS = ("What is the capital of France?", "The capital of France is Paris.", "asdf qwerty zxcv")


def test_the_judge_scores_the_answer_above_nonsense_in_either_order(tiny_judge_url):
    """The judge's direction with a real vLLM judge, through rlsteps' client and parsing at temperature 0 with
    structured output: the answer wins both as response 1 and as response 2. A client that put the responses in
    each other's sections, or a parser or scorer that swapped score_1 and score_2, gives the nonsense the win."""
    question, good, bad = UNAMBIGUOUS
    conversation = [{"role": "user", "content": question}]
    options = {"temperature": 0.0, "max_tokens": 64, "max_retries": 0, "both_orders": False}  # each order on its own
    with JudgeClient(tiny_judge_url, TINY_JUDGE_NAME, **options) as client:
        result = client.judge([(conversation, [good, bad]), (conversation, [bad, good])])
    answers = [a.content for a in result.answers]
    assert [a.failure for a in result.answers] == [None, None], answers
    # the judge reads the responses: its judgement changes with their order, where a position-biased judge's would
    # not (and a bias towards one position could pass one order by chance, never both)
    assert json.loads(answers[0]) != json.loads(answers[1]), answers
    (good_first, bad_second), (bad_first, good_second) = result.rewards
    assert good_first > bad_second and good_second > bad_first, (result.rewards, answers)
