"""Tiny steps end to end, as a user runs them: real servers on loopback, real weights, real files."""

import json
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from policy_speech import against_sft, validation_prompts
from rlsteps.tiny import task as tiny_task
from run_helpers import (
    FAST,
    artifact_metadata,
    rlsteps,
    run_dir,
    series,
    start_rlsteps,
    straight_and_resumed,
    wait_for,
    weights,
)

pytestmark = pytest.mark.slow

# six steps, a checkpoint after each: a run stopped mid-way has checkpoints to resume from
STOPPABLE = ["train.max_steps=6", "checkpoint.interval=1", "validation.interval=0"]


def _assert_stopped_cleanly(process, log_path, run):
    """Exit 1 with a one-line cause, no traceback, every checkpoint complete, and no output artifact."""
    code = process.wait(timeout=300)
    log = log_path.read_text()
    assert code == 1, log[-3000:]
    assert "rewards unavailable at step" in log and "is intact and a rerun resumes from it" in log
    assert "Traceback" not in log
    checkpoints = sorted((run / "checkpoints").glob("step_*"))
    assert checkpoints and all((c / "COMPLETE").exists() for c in checkpoints)
    assert not (run / "policy").exists()


def _mean(values):
    return sum(values) / len(values)


# where the SFT policy starts on the tiny world of seed 0 (docs/steps-and-configs.md says the same): its greedy answers
# name the noun with neutral adjectives ("The tree is old."), 1.0 of the hidden true reward's 3.0
START_GREEDY_TRUE_REWARD = 1.0
# the true reward of the greedy validation answers ends at least this high: the task's whole sentence with the noun
# and three or more positive adjectives; an answer that repeats a word, drops the "and" or the noun, or runs on scores
# 0.0 (benchmarks/README.md: over run seeds 0-4 and world seeds 0-2 each recipe's median is 3.0, and every one of the
# 45 runs ends at 2.5 or more)
FINAL_TRUE_REWARD = 2.5
# each recipe learns from a run seed other than 0, the seed the tiny configs ship, so that a default that works for one
# seed only shows here. rl/rlhf at run seed 3: on the tiny world v17 it ended at 2.34, 22% of its greedy answers
# leaving the noun out ("The looks bright, ..."); on v20 at 3.0, on v21 at 3.0 (each of the 15 rl/rlhf runs ends at 3.0)
LEARNING_RUNS = [("rl/rs", "rl_rs", 1), ("rl/reinforce", "rl_reinforce", 2), ("rl/rlhf", "rl_rlhf", 3)]


SAMPLES_PER_STEP = 32  # rollouts of each step in samples.jsonl: 128 over the first four steps, 128 over the last four


def gaming_shares(samples: list[dict], steps: range) -> dict[str, float]:
    """The shares of the sampled rollouts of these steps that name a wrong noun, or hold a broken word."""
    chosen = [s for s in samples if s["split"] == "train" and s["step"] in steps]
    return {
        "wrong noun": _mean([tiny_task.names_a_wrong_noun(s["prompt"], s["response"]) for s in chosen]),
        "broken word": _mean([tiny_task.has_a_broken_word(s["response"]) for s in chosen]),
    }


def fault_ranks(samples: list[dict], steps: range) -> list[float]:
    """Where each sampled rollout of these steps with a fault (tiny_task.faults) stands in its prompt's group by
    reward: 0 the lowest, 1 the highest (ties share their mean place)."""
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        if s["split"] == "train" and s["step"] in steps:
            groups.setdefault((s["step"], s["prompt_id"]), []).append(s)
    ranks = []
    for group in (g for g in groups.values() if len(g) > 1):
        rewards = [s["reward"] for s in group]
        for s in group:
            if tiny_task.faults(s["prompt"], s["response"]):
                below, alike = sum(r < s["reward"] for r in rewards), rewards.count(s["reward"]) - 1
                ranks.append((below + alike / 2) / (len(group) - 1))
    return ranks


@pytest.mark.parametrize("step, slug, seed", LEARNING_RUNS)
def test_tiny_step_trains_and_the_reward_rises(tiny_world, tmp_path, step, slug, seed):
    overlap = "run.overlap_reference=true" if step == "rl/rlhf" else "run.overlap_reference=auto"  # each way once
    done = rlsteps(
        "run",
        step,
        "-c",
        "tiny",
        *FAST,
        f"seed={seed}",
        f"logging.samples_per_step={SAMPLES_PER_STEP}",
        overlap,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(tmp_path, slug)
    train, val = series(run, "train/reward"), series(run, "val/reward_mean")
    # step 0, then every 4 steps; rl/rlhf's judge has no figure at step 0, where each greedy answer is its reference
    assert len(train) == 16 and len(val) == (4 if step == "rl/rlhf" else 5)
    assert _mean(train[-4:]) > _mean(train[:4]), train
    # rl/rlhf's judge first scores at step 4, the greedy answers against step 0's: on the tiny world v17 it stands at
    # its ceiling (5.78) from there, so it cannot rise further; the true reward below says what was learnt
    assert val[-1] > val[0] or (step == "rl/rlhf" and val[-1] == val[0] == max(val)), val
    true = series(run, "val/true_reward")  # what the reward model stands for: a hacked reward would not move it
    assert len(true) == 5 and true[0] == START_GREEDY_TRUE_REWARD and true[-1] >= FINAL_TRUE_REWARD, true
    # and no sign of reward hacking said on the way: the watch is quiet on a run that learns the task
    assert "reward hacking?" not in done.stderr and not (run / "reward_hacking.jsonl").exists(), done.stderr[-3000:]
    # what the policy says beside what the SFT policy said, sampled and greedy: it ends, keeps the task's sentence,
    # repeats no word and answers each prompt in its own words as well as before (tests/policy_speech.py)
    figures, worse = against_sft(run / "policy", tiny_world.policy_megatron, validation_prompts(tiny_world.val_prompts))
    assert not worse, f"{worse}\n{figures}"
    assert series(run, "train/steps_without_update") == [0] * 16
    agreement = series(run, "train/token_mult_prob_error")  # the built-in sampler is the trainer's own model
    assert len(agreement) == 16 and all(1.0 <= x < 1.001 for x in agreement), agreement
    assert "rollouts: the built-in sampler, 128 rows per batch" in done.stderr
    # the reference's log-probs computed while the rewards were scored where asked; on a CPU by default after them,
    # in prepare (rl/rs has no reference)
    assert len(series(run, "timers/reference")) == (16 if step == "rl/rlhf" else 0)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["split"] for s in samples} == {"train", "val"} and len(
        [s for s in samples if s["split"] == "train"]
    ) == 16 * SAMPLES_PER_STEP
    # the sampled rollouts game the reward model no more at the end than at the start: a reward model that checked
    # neither the noun nor the words let both rise (tiny world v8: a wrong noun from 2% to 9%, broken words to 7%)
    first, last = gaming_shares(samples, range(1, 5)), gaming_shares(samples, range(13, 17))
    assert all(last[kind] <= first[kind] + 1 / 64 for kind in first), (first, last)
    # and the rollouts with a fault (a wrong noun, a broken or repeated word) score low in their groups, not high
    ranks = fault_ranks(samples, range(9, 17))
    assert not ranks or _mean(ranks) < 0.5, ranks
    assert all({"prompt", "response", "reward", "valid", "ended"} <= s.keys() for s in samples)
    assert "sample tiny-val-" in done.stderr  # validation shows a couple on the terminal
    assert "step 16/16" in (run / "train.log").read_text()
    meta = artifact_metadata(run)  # Megatron in (the tiny configs read policy_megatron), Megatron out
    assert meta["type"] == "checkpoint_megatron" and meta["producer"]["step"] == step
    assert meta["counters"] == {
        "step": 16,
        "consumed_samples": 256,
        "optimizer_steps": meta["counters"]["optimizer_steps"],
        "epoch": 0,
    }
    iteration = meta["counters"]["optimizer_steps"]
    assert (run / "policy" / "latest_checkpointed_iteration.txt").read_text() == str(iteration)
    assert (run / "policy" / f"iter_{iteration:07d}" / "metadata.json").is_file()
    trained, initial = weights(run / "policy"), weights(tiny_world.policy_megatron)
    assert trained.keys() == initial.keys() and any(not torch.equal(trained[k], initial[k]) for k in trained)
    assert (run / "metrics.png").stat().st_size > 10_000
    job_dir = next((tmp_path / ".rlsteps" / "jobs").iterdir())
    job = OmegaConf.to_container(OmegaConf.load(job_dir / "job.yaml"))
    assert job["job"]["step"] == step and job["argv"][:3] == ["rlsteps", "run", step]
    assert {i["name"]: i["status"] for i in job["inputs"]}["policy"] == "ok"
    assert "torch" in job["versions"] and job["rlsteps"]["source"]["git"] is not None  # tests run from a checkout
    assert job["config"]["output"]["dir"] == f".rlsteps/runs/{slug}-tiny"


def test_rerun_resumes_and_a_sigkilled_run_ends_with_the_same_weights(tiny_world, tmp_path):
    """Kill a run with SIGKILL after its step-2 checkpoint; the rerun ends where an uninterrupted run ends."""
    short = ["train.max_steps=4", "checkpoint.interval=2", "validation.interval=0", *FAST]
    straight_run, resumed_run = straight_and_resumed("rs", "rl_rs", short, tmp_path)
    a, b = weights(straight_run / "policy"), weights(resumed_run / "policy")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)
    assert artifact_metadata(resumed_run)["counters"]["step"] == 4

    straight = tmp_path / "straight"  # finished: run again there
    written, server_log = artifact_metadata(straight_run), straight_run / "rm_server.log"
    served = server_log.read_text()
    again = rlsteps("run", "rs", "-c", "tiny", *short, cwd=straight)  # finished: says so, starts and writes nothing
    assert again.returncode == 0 and "already done: " in again.stderr and "after 4 steps" in again.stderr
    assert server_log.read_text() == served and artifact_metadata(straight_run) == written
    longer = rlsteps("run", "rs", "-c", "tiny", *short[1:], "train.max_steps=5", cwd=straight)  # a changed config
    assert longer.returncode == 0 and "already done" not in longer.stderr, longer.stderr[-3000:]
    assert artifact_metadata(straight_run)["counters"]["step"] == 5


def test_reward_server_down_mid_run_stops_after_a_checkpoint_and_the_rerun_resumes(tiny_world, tmp_path):
    from rlsteps.engine.rewards.process import LocalServer

    args = [*STOPPABLE, "rm.max_retries=1", "rm.backoff_s=0.1", "rm.timeout_s=5", *FAST]
    with LocalServer(
        "rlsteps.engine.rewards.rm", ["--model", str(tiny_world.reward_model)], log_path=tmp_path / "rm.log"
    ) as server:
        process = start_rlsteps(
            "run", "rs", "-c", "tiny", f"rm.url={server.url}", *args, cwd=tmp_path, log=tmp_path / "run.log"
        )
        wait_for(run_dir(tmp_path, "rl_rs") / "checkpoints" / "step_2" / "COMPLETE", 300, process)
    _assert_stopped_cleanly(process, tmp_path / "run.log", run_dir(tmp_path, "rl_rs"))

    resumed = rlsteps("run", "rs", "-c", "tiny", *args, cwd=tmp_path)  # no rm.url: the step serves the tiny RM itself
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    assert artifact_metadata(run_dir(tmp_path, "rl_rs"))["counters"]["step"] == 6


def test_unreachable_reward_server_fails_fast_with_the_url_and_the_fix(tiny_world, tmp_path):
    done = rlsteps(
        "run",
        "rs",
        "-c",
        "tiny",
        "rm.url=http://127.0.0.1:9",
        "rm.max_retries=1",
        "rm.backoff_s=0.1",
        *FAST,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 1
    assert "http://127.0.0.1:9" in done.stderr and "check the reward server at rm.url" in done.stderr
    assert "Traceback" not in done.stderr


def test_malformed_prompt_file_fails_before_training_with_file_and_line(tiny_world, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Describe the cat."}\n{"prompt": "Describe the dog."\n')
    started = time.monotonic()
    done = rlsteps("run", "rs", "-c", "tiny", f"inputs.prompts={bad}", *FAST, cwd=tmp_path, timeout=300)
    assert done.returncode == 3, done.stderr  # a bad input artifact, found before the job starts
    assert f"input 'prompts': {bad}:2: invalid JSON" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 20  # no server started, no policy loaded
    assert not (tmp_path / ".rlsteps" / "jobs").exists() and not run_dir(tmp_path, "rl_rs").exists()


def test_inputs_only_the_policys_tokenizer_can_judge_fail_the_job_before_it_loads_the_policy(tiny_world, tmp_path):
    import shutil

    policy = tmp_path / "policy"  # a Hugging Face causal LM without its tokenizer files
    shutil.copytree(tiny_world.policy, policy, ignore=shutil.ignore_patterns("tokenizer*", "chat_template*"))
    runs = tmp_path / ".rlsteps" / "runs"
    done = rlsteps("run", "rs", "-c", "tiny", f"inputs.policy={policy}", f"output.dir={runs}/a", *FAST, cwd=tmp_path)
    assert done.returncode == 3 and f"input 'policy': {policy} holds no tokenizer" in done.stderr  # before the job
    assert not (runs / "a").exists()
    long = tmp_path / "long.jsonl"
    long.write_text('{"prompt": "Describe the cat in many words."}\n')
    too_long = ["data.max_prompt_tokens=4", f"output.dir={runs}/b", f"inputs.prompts={long}"]
    done = rlsteps("run", "rs", "-c", "tiny", *too_long, *FAST, cwd=tmp_path)
    assert done.returncode == 3 and f"input 'prompts': {long}:1: the prompt has" in done.stderr
    assert "Traceback" not in done.stderr and "code: rlsteps" in done.stderr  # the worker's own check
    assert "2 steps" not in done.stderr and "epoch(s)" not in done.stderr  # before the policy and prompts load


@pytest.mark.parametrize("arch, output", [("qwen2", "checkpoint_megatron"), ("gpt2", "checkpoint_hf")])
def test_a_differently_configured_architecture_trains(tiny_world, tmp_path, arch, output):
    from transformers import AutoTokenizer

    from rlsteps.tiny.models import build_random_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(tiny_world.policy)
    model = build_random_causal_lm(arch, tokenizer, seed=1, hidden=48, layers=3)
    policy = tmp_path / f"{arch}-policy"
    model.save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    for slug, step in (("rl_rs", "rl/rs"), ("rl_reinforce", "rl/reinforce")):
        done = rlsteps(
            "run",
            step,
            "-c",
            "tiny",
            f"inputs.policy={policy}",
            "train.max_steps=2",
            "validation.interval=0",
            "rollout.sampling.max_new_tokens=12",
            f"output.type={output}",
            *FAST,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        from rlsteps.engine.policy.model import load_policy

        assert load_policy(run_dir(tmp_path, slug) / "policy")[0].config.model_type == arch
        meta = artifact_metadata(run_dir(tmp_path, slug))
        assert meta["type"] == output and meta["counters"]["step"] == 2
        # rejection sampling learns from every scored row; REINFORCE only from ended ones, and a random policy
        # ends a 12-token response now and then: a step updates exactly when one of its 64 rows ended
        ended = series(run_dir(tmp_path, slug), "train/fraction_ended")
        learning_steps = 2 if step == "rl/rs" else sum(fraction > 0 for fraction in ended)
        assert meta["counters"]["optimizer_steps"] == learning_steps, ended


def test_judge_down_mid_run_stops_cleanly_with_checkpoints_intact(tiny_world, tmp_path):
    from rlsteps.engine.rewards.process import LocalServer

    args = [*STOPPABLE, "judge.on_failure=stop", "judge.max_retries=1", "judge.timeout_s=5", *FAST]
    with LocalServer(
        "rlsteps.engine.rewards.judge", ["--model", str(tiny_world.reward_model)], log_path=tmp_path / "judge.log"
    ) as server:
        process = start_rlsteps(
            "run", "rlhf", "-c", "tiny", f"judge.url={server.url}/v1", *args, cwd=tmp_path, log=tmp_path / "run.log"
        )
        wait_for(run_dir(tmp_path, "rl_rlhf") / "checkpoints" / "step_2" / "COMPLETE", 300, process)
    _assert_stopped_cleanly(process, tmp_path / "run.log", run_dir(tmp_path, "rl_rlhf"))


def test_batch_profile_detaches_and_the_job_finishes_in_the_background(tiny_world, tmp_path):
    (tmp_path / "rlsteps.yaml").write_text("profiles:\n  here: {executor: local}\n")
    done = rlsteps(
        "run",
        "rs",
        "-c",
        "tiny",
        "-b",
        "here",
        "train.max_steps=2",
        "validation.interval=0",
        *FAST,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "submitted job" in done.stdout
    job_dir = next((tmp_path / ".rlsteps" / "jobs").iterdir())
    pid = int((job_dir / "worker.pid").read_text())
    wait_for(run_dir(tmp_path, "rl_rs") / "policy" / "rlsteps_artifact.json", 300)
    assert "output artifact" in (job_dir / "worker.log").read_text()
    assert job_dir.name in done.stdout and pid > 0  # the job's id is its directory's name, as for attached runs


def test_a_compiled_update_trains_as_the_eager_one_and_says_where_torch_caches_it(tiny_world, tmp_path, monkeypatch):
    """train.compile=true, a whole rl/reinforce step (packed micro-batches, the reference, a checkpoint and the
    output): the first update's loss is the eager run's on the same rollouts, the output is written, and the run names
    the folder torch's compiler cached its code in (TORCHINDUCTOR_CACHE_DIR), which holds it afterwards."""
    cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    one_step = ["train.max_steps=1", "validation.interval=0", *FAST]
    losses = {}
    for mode in ("eager", "compiled"):
        (tmp_path / mode).mkdir()
        done = rlsteps("run", "rl/reinforce", "-c", "tiny", *one_step, f"train.compile={mode == 'compiled'}",
                       cwd=tmp_path / mode)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        run = run_dir(tmp_path / mode, "rl_reinforce")
        assert (run / "policy" / "rlsteps_artifact.json").is_file()
        losses[mode] = series(run, "train/loss")[0]
        said = "train.compile: the policy's forward compiles at the first update" in done.stderr
        assert said == (mode == "compiled") and (f"(cached in {cache} for later runs)" in done.stderr) == said
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-4)
    assert any(cache.iterdir())


def test_the_convert_steps_round_trip_the_tiny_policy_bit_for_bit(tiny_world, tmp_path):
    from rlsteps.engine.policy.model import load_policy

    to_megatron = rlsteps("run", "convert/hf_to_megatron", "-c", "tiny", cwd=tmp_path, timeout=300)
    assert to_megatron.returncode == 0, to_megatron.stderr[-3000:]
    megatron = run_dir(tmp_path, "convert_hf_to_megatron") / "policy"
    back = rlsteps(
        "run", "convert/megatron_to_hf", "-c", "tiny", f"inputs.checkpoint={megatron}", cwd=tmp_path, timeout=300
    )
    assert back.returncode == 0, back.stderr[-3000:]
    hf = run_dir(tmp_path, "convert_megatron_to_hf") / "policy"
    assert (
        artifact_metadata(hf.parent)["type"] == "checkpoint_hf"
        and artifact_metadata(megatron.parent)["type"] == "checkpoint_megatron"
    )
    original, returned = weights(tiny_world.policy), weights(hf)
    assert original.keys() == returned.keys() and all(torch.equal(original[k], returned[k]) for k in original)
    assert json.loads((hf / "config.json").read_text()) == json.loads((tiny_world.policy / "config.json").read_text())
    (a, tokenizer), (b, _) = load_policy(tiny_world.policy), load_policy(hf)
    tokens = torch.tensor([tokenizer("Describe the castle. The castle looks lovely.").input_ids])
    assert torch.equal(a(tokens).logits, b(tokens).logits)


def test_a_run_that_learns_nothing_stops_with_exit_1_instead_of_finishing(tiny_world, tmp_path):
    """One new token per response: nothing ends with EOS, nothing is learned, and the third such step stops it."""
    args = ["rollout.sampling.max_new_tokens=1", "train.max_steps=6", "validation.interval=0", *FAST]
    done = rlsteps("run", "rl/reinforce", "-c", "tiny", *args, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "3 steps in a row made no optimizer update (train.max_steps_without_update=3)" in done.stderr
    assert "no sample ended with EOS (raise rollout.sampling.max_new_tokens)" in done.stderr
    assert done.stderr.count("made no optimizer update: no sample ended") == 2  # steps 1 and 2 warned first
    run = run_dir(tmp_path, "rl_reinforce")
    assert series(run, "train/steps_without_update") == [1, 2, 3]
    assert (run / "checkpoints" / "step_3" / "COMPLETE").exists() and not (run / "policy").exists()


def test_another_config_into_a_run_directory_with_checkpoints_is_refused(tiny_world, tmp_path):
    short = ["train.max_steps=2", "validation.interval=0", *FAST]
    assert rlsteps("run", "rl/rs", "-c", "tiny", *short, cwd=tmp_path).returncode == 0
    run = run_dir(tmp_path, "rl_rs")
    before = artifact_metadata(run)
    changed = rlsteps("run", "rl/rs", "-c", "tiny", *short, "train.lr=1e-4", cwd=tmp_path)
    assert changed.returncode == 2, changed.stderr[-3000:]  # a config error
    tiny_lr = OmegaConf.load(Path(__file__).parents[1] / "steps" / "rl" / "rs" / "tiny.yaml").train.lr
    assert f"holds checkpoints of a run with another config: train.lr ({tiny_lr} -> 0.0001)" in changed.stderr
    assert "output.dir=NEW_DIR" in changed.stderr
    assert artifact_metadata(run) == before  # the finished run's output and provenance are untouched
    longer = rlsteps("run", "rl/rs", "-c", "tiny", "train.max_steps=3", *short[1:], cwd=tmp_path)
    assert longer.returncode == 0, longer.stderr[-3000:]  # more steps continue the same run
    assert "resuming from" in longer.stderr and artifact_metadata(run)["counters"]["step"] == 3
