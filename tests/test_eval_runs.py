"""eval/policy end to end on the tiny world: the shipped pipeline (rl/reinforce, then the eval of its policy against
the policy it started from) shows the run's gain; an eval resumes without redoing done prompts; `rlsteps eval
compare` and `rlsteps artifacts show` print reports."""

import json
import shutil

import pytest

from cli_helpers import REPO
from run_helpers import rlsteps

pytestmark = pytest.mark.slow

EVAL = ".rlsteps/pipelines/tiny_eval/eval"


def test_the_pipeline_example_reports_the_gain_of_its_rl_stage(tiny_world, tmp_path):
    shutil.copy(REPO / "examples" / "pipelines" / "tiny_eval.yaml", tmp_path / "p.yaml")
    done = rlsteps("pipeline", "run", "p.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report_dir = tmp_path / EVAL / "report"
    report = json.loads((report_dir / "report.json").read_text())
    meta = json.loads((report_dir / "rlsteps_artifact.json").read_text())
    assert meta["type"] == "eval_report" and meta["producer"]["step"] == "eval/policy"
    assert report["inputs"]["baseline"] == str(tiny_world.policy_megatron)  # the RL stage's input policy
    assert report["inputs"]["policy"].endswith("tiny_eval/reinforce/policy")
    true = report["sources"]["true_reward"]
    assert true["greedy"]["policy"]["mean"] > true["greedy"]["baseline"]["mean"] + 0.5
    assert true["greedy"]["difference"]["low"] > 0 and true["greedy"]["difference"]["gains"] > 20
    assert true["pass_at_k"]["4"]["policy"]["mean"] > true["pass_at_k"]["4"]["baseline"]["mean"]
    judge = report["judge"]
    assert judge["win_rate"]["low"] > 0.5 and judge["sign_test_p"] < 0.01 and judge["verdicts"] == 64
    assert (report_dir / "report.png").stat().st_size > 10_000
    assert "| true_reward (greedy mean) |" in (report_dir / "report.md").read_text()

    again = rlsteps("pipeline", "run", "p.yaml", cwd=tmp_path, timeout=120)
    assert again.returncode == 0 and again.stdout.count("skipped (output exists, same config and inputs)") == 2

    compared = rlsteps("eval", "compare", EVAL, str(report_dir), "--json", cwd=tmp_path)
    figures = json.loads(compared.stdout)
    assert (
        figures["true_reward greedy mean"]["a"] == figures["true_reward greedy mean"]["b"] == true["greedy"]["policy"]
    )
    (tmp_path / "rlsteps.yaml").write_text("artifacts:\n  root: store\n")
    assert rlsteps("artifacts", "publish", str(report_dir), "tiny-eval", cwd=tmp_path).returncode == 0
    shown = rlsteps("artifacts", "show", "tiny-eval", cwd=tmp_path)
    assert '"type": "eval_report"' in shown.stdout and "| true_reward (greedy mean) |" in shown.stdout


def test_an_eval_goes_on_from_the_prompts_it_had_done(tiny_world, tmp_path):
    args = ["run", "eval/policy", "-c", "tiny", "run.num_threads=1", "output.dir=run", "eval.num_prompts=8"]
    args += ["eval.batch_prompts=4", "rewards.reward_model=null", "rewards.judge=null", "eval.bootstrap_resamples=200"]
    first = rlsteps(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    results = tmp_path / "run" / "results" / "policy.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    report = (tmp_path / "run" / "report" / "report.json").read_text()
    # as a kill leaves it: the first batch whole, the next one's line torn, no report
    results.write_text("".join(lines[:4]) + lines[4][:30])
    shutil.rmtree(tmp_path / "run" / "report")
    resumed = rlsteps(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "policy (" in resumed.stderr and ": 4 of 8 prompts to do" in resumed.stderr
    assert "baseline (" in resumed.stderr and ": 0 of 8 prompts to do" in resumed.stderr
    assert results.read_text().splitlines(keepends=True) == lines  # the same samples, drawn from the same seeds
    assert (tmp_path / "run" / "report" / "report.json").read_text() == report

    again = rlsteps(*args, cwd=tmp_path)
    assert again.returncode == 0 and "already done" in again.stderr
    other = rlsteps(*args, "eval.samples_per_prompt=2", "eval.pass_k=[1,2]", cwd=tmp_path)
    assert other.returncode == 1 and "holds the results of another eval config" in other.stderr
