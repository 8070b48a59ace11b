"""grpo.dynamic_sampling in the embedded engine: a step draws generation batches until it holds prompts_per_step groups
whose rewards differ, as NeMo-RL v0.7.0's grpo.use_dynamic_sampling does (rlsteps.engine.algorithms.dynamic_sampling).

- by hand: which groups are kept, in what order, what is dropped and that nothing is carried over;
- against NeMo-RL's own dynamic_sampling, called as its grpo_train calls it (batch cache, generation batch count) on
  the same generation batches: the same rows train, the same number of batches is drawn, the same surplus is dropped,
  and the same batch count raises;
- tiny runs (slow): the refill's metrics and the prompts it consumes, an exact resume, the error at the bound.
"""

from __future__ import annotations

import pytest
import torch

from rlsteps.engine.algorithms.dynamic_sampling import DynamicSamplingExhausted, KeptGroups
from test_oracle_maths import nemo_rl


def test_kept_groups_by_hand():
    """4 prompts a step, 3 needed. Batch 0 keeps prompts 1 and 3; batch 1 keeps 0, 2 and 3: the step trains on
    (0, 1), (0, 3), (1, 0), in the order kept; (1, 2) and (1, 3) are dropped, not carried over."""
    kept = KeptGroups(needed=3, max_gen_batches=10)
    kept.add([True, False, True, False])
    assert not kept.full and kept.kept == [(0, 1), (0, 3)]
    kept.add([False, True, False, False])
    assert kept.full and kept.generation_batches == 2
    assert kept.chosen() == [(0, 1), (0, 3), (1, 0)]
    assert kept.stats() == {
        "train/dynamic_sampling_gen_batches": 2.0,
        "train/dynamic_sampling_discarded_groups": 2.0,  # (1, 2) and (1, 3)
        "train/fraction_dropped_zero_variance": 3 / 8,
    }
    fresh = KeptGroups(needed=3, max_gen_batches=10)  # the next step starts empty
    assert fresh.kept == [] and fresh.generation_batches == 0


def test_the_bound_allows_one_batch_more_than_it_says_then_stops_naming_the_key():
    """NeMo-RL draws another generation batch while the count drawn is at most dynamic_sampling_max_gen_batches: with
    a bound of 2 the third batch still fills the step; a third batch that does not stops it."""
    filled = KeptGroups(needed=2, max_gen_batches=2)
    for flags in ([True, True], [True, True], [False, False]):
        filled.add(flags)
    assert filled.full and filled.chosen() == [(2, 0), (2, 1)]

    short = KeptGroups(needed=2, max_gen_batches=2)
    short.add([True, False])
    short.add([True, True])
    with pytest.raises(DynamicSamplingExhausted, match=r"grpo\.dynamic_sampling_max_gen_batches=2") as stopped:
        short.add([True, True])
    assert "after 3 generation batches (6 prompt groups) only 1 had rewards that differ, of the 2" in str(stopped.value)
    assert "raise grpo.dynamic_sampling_max_gen_batches" in stopped.value.fix


PROMPTS, PER_PROMPT = 6, 4
# (seed, chance a group is dropped, grpo.dynamic_sampling_max_gen_batches)
ORACLE_CASES = [(0, 0.3, 10), (1, 0.6, 10), (2, 0.8, 10), (3, 0.9, 2), (4, 0.95, 3), (5, 0.0, 1), (6, 1.0, 2)]


def generation_batches(seed: int, drop: float, count: int = 12) -> list[list[bool]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(PROMPTS, generator=g) < drop).tolist() for _ in range(count)]


def rlsteps_kept(batches: list[list[bool]], bound: int) -> dict:
    kept = KeptGroups(PROMPTS, bound)
    try:
        for flags in batches:
            kept.add(flags)
            if kept.full:
                break
    except DynamicSamplingExhausted:
        return {"error": True, "batches": kept.generation_batches}
    rows = [(k * PROMPTS + j) * PER_PROMPT + r for k, j in kept.chosen() for r in range(PER_PROMPT)]
    discarded = kept.stats()["train/dynamic_sampling_discarded_groups"] * PER_PROMPT
    return {"ids": rows, "batches": kept.generation_batches, "discarded": discarded}


def nemo_rl_call(batches: list[list[bool]], bound: int) -> dict:
    """Each generation batch as NeMo-RL's grpo_train hands it over: rows with ids, each with its group's std (0 for a
    group whose rewards do not differ)."""
    generated = []
    for k, flags in enumerate(batches):
        ids = [(k * PROMPTS + j) * PER_PROMPT + r for j in range(PROMPTS) for r in range(PER_PROMPT)]
        std = [0.0 if flags[j] else 1.0 for j in range(PROMPTS) for _ in range(PER_PROMPT)]
        generated.append({"ids": ids, "std": std})
    grpo = {"num_prompts_per_step": PROMPTS, "num_generations_per_prompt": PER_PROMPT,
            "dynamic_sampling_max_gen_batches": bound}  # fmt: skip
    return {"fn": "dynamic_sampling", "grpo": grpo, "generation_batches": generated}


@pytest.fixture(scope="module")
def upstream_results() -> dict:
    calls = {case: nemo_rl_call(generation_batches(*case[:2]), case[2]) for case in ORACLE_CASES}
    return dict(zip(calls, nemo_rl(list(calls.values())), strict=True))


@pytest.mark.parametrize("case", ORACLE_CASES, ids=lambda c: f"seed{c[0]}-drop{c[1]}-max{c[2]}")
def test_the_rows_that_train_equal_nemo_rls_dynamic_sampling(upstream_results, case):
    seed, drop, bound = case
    theirs = upstream_results[case]
    ours = rlsteps_kept(generation_batches(seed, drop), bound)
    assert "incomplete" not in theirs
    if "error" in theirs:
        assert ours == {"error": True, "batches": theirs["batches"]}
        assert "maximum allowed number of batches" in theirs["error"]
    else:
        assert ours == theirs


# Tiny runs: the true reward's few values (2 rollouts a prompt) leave some groups without a difference to learn from
TRUE_REWARD = "rlsteps.tiny.task:true_reward"
REFILLED = [
    "rewards.judge=null", f"rewards.true.function={TRUE_REWARD}", "grpo.dynamic_sampling=true",
    "rollout.prompts_per_step=4", "rollout.num_rollouts_per_prompt=2", "train.global_batch_size=8",
    "train.micro_batch_size=4", "validation.interval=0",
]  # fmt: skip


@pytest.mark.slow
def test_a_tiny_run_refills_its_steps_counts_the_prompts_drawn_and_resumes_exactly(tiny_world, tmp_path):
    """Each step logs its generation batches; consumed_samples counts every prompt drawn (4 a generation batch), so
    the data order goes on after the last batch drawn and a run killed after step 2 resumes to the same weights."""
    from run_helpers import FAST, series, straight_and_resumed, weights

    # 8 steps: a step takes a fraction of a second, and the kill may land after a later checkpoint than step 2's
    overrides = [*REFILLED, "train.max_steps=8", "checkpoint.interval=2", *FAST]
    straight, resumed = straight_and_resumed("rl/rlhf", "rl_rlhf", overrides, tmp_path)
    batches = series(straight, "train/dynamic_sampling_gen_batches")
    consumed = series(straight, "train/consumed_samples")
    assert len(batches) == 8 and max(batches) > 1, batches
    assert consumed == [4 * sum(batches[: i + 1]) for i in range(8)]
    assert series(resumed, "train/consumed_samples")[-2:] == consumed[-2:]
    assert series(resumed, "train/dynamic_sampling_gen_batches")[-2:] == batches[-2:]
    a, b = weights(straight / "policy"), weights(resumed / "policy")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
def test_a_tiny_run_whose_groups_never_differ_stops_at_the_bound_naming_the_key(tiny_world, tmp_path):
    """Every reward 0 (the true reward weighted 0): no group is kept; the step stops after the bound's batches plus
    one with the cause and the fix, no traceback."""
    from run_helpers import FAST, rlsteps

    done = rlsteps(
        "run", "rl/rlhf", "-c", "tiny", *REFILLED, "rewards.true.weight=0", "grpo.dynamic_sampling_max_gen_batches=2",
        "train.max_steps=2", "checkpoint.interval=0", *FAST, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    assert "after 3 generation batches (12 prompt groups) only 0 had rewards that differ" in done.stderr
    assert "fix: raise grpo.dynamic_sampling_max_gen_batches" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_two_processes_keep_the_groups_one_process_keeps_and_end_with_its_weights(tiny_world, tmp_path):
    """Each process judges its own groups; the verdicts gathered in prompt order are the same everywhere, and the
    groups kept are dealt to the processes as a step's prompts are: the same steps, prompts and weights as one."""
    from run_helpers import FAST, rlsteps, run_dir, series, weights

    runs = {}
    for name, extra in (("one", []), ("two", ["-r", "two"])):
        root = tmp_path / name
        root.mkdir()
        (root / "rlsteps.yaml").write_text("profiles:\n  two:\n    executor: local\n    nprocs_per_node: 2\n")
        done = rlsteps(
            "run", "rl/rlhf", "-c", "tiny", *extra, *REFILLED, "train.max_steps=4", "checkpoint.interval=0", *FAST,
            cwd=root,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = run_dir(root, "rl_rlhf")
    one, two = runs["one"], runs["two"]
    assert max(series(one, "train/dynamic_sampling_gen_batches")) > 1
    for key in ("train/dynamic_sampling_gen_batches", "train/consumed_samples", "train/reward"):
        assert series(two, key) == pytest.approx(series(one, key), abs=1e-6), key
    a, b = weights(one / "policy"), weights(two / "policy")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-4, msg=name)
