"""The split NeMo-RL's first step asserts on (nemo_rl/batches.py), on hand-computed examples, and its repair:
every fix it suggests passes (NeMo-RL's own code runs the fixed configs in tests/test_nemo_rl_runs.py)."""

import itertools

import pytest

from rlsteps.nemo_rl.batches import GLOBAL_BATCH, LOGPROB_BATCH, MICRO_BATCH, PROMPTS, Split, repair


def split(prompts=32, generations=8, batch=256, dp=8, micro=None, logprob=None) -> Split:
    return Split(prompts, generations, batch, dp, micro, logprob)


def test_the_seed_commands_split_fails_as_nemo_rl_fails_and_its_global_batch_follows_the_rows():
    broken = split(batch=512)  # 32 x 8 = 256 rows a step against the template's 512
    assert broken.problems() == ["Total batch size (256) is not a multiple of batch_size (512) [Policy.train]"]
    assert repair(broken) == {GLOBAL_BATCH: 256}
    assert split().problems() == [] and repair(split()) == {}


def test_seven_policy_gpus_take_the_nearest_prompts_whose_rows_split():
    # 256 rows over 7 ranks: 7 divides neither 256 nor any divisor of it; 35 prompts (3 away) before 28 (4 away)
    broken = split(dp=7)
    assert broken.problems() == [
        "Batch size (256) is not a multiple of shards (7) [Policy.train]",
        "Batch size (256) is not a multiple of shards (7) [Policy.get_logprobs]",
    ]
    assert repair(broken) == {PROMPTS: 35, GLOBAL_BATCH: 280}


def test_twenty_four_ranks_need_prompts_a_multiple_of_three():
    assert repair(split(dp=24)) == {PROMPTS: 33, GLOBAL_BATCH: 264}  # 33 x 8 = 264 = 24 x 11


def test_a_global_batch_that_does_not_divide_the_rows_moves_to_the_nearest_that_does():
    # rows 256, 4 ranks: the multiples of 4 that divide 256 are 4, 8, ..., 128, 256; 128 is nearest 100
    assert repair(split(batch=100, dp=4)) == {GLOBAL_BATCH: 128}


def test_without_packing_each_ranks_share_splits_into_micro_batches():
    broken = split(micro=3, logprob=5)  # each rank trains on 256 / 8 = 32 rows and scores 32
    assert broken.problems() == [
        "Data dict size (32) is not a multiple of the provided microbatch size (3) [the policy worker's train]",
        "Data dict size (32) is not a multiple of the provided microbatch size (5) [the policy worker's get_logprobs]",
    ]
    assert repair(broken) == {MICRO_BATCH: 2, LOGPROB_BATCH: 4}


@pytest.mark.parametrize(("micro", "logprob"), [(None, None), (4, 4), (3, 8)])
def test_every_repair_passes(micro, logprob):
    for prompts, generations, batch, dp in itertools.product((1, 7, 32), (1, 4, 8, 16), (64, 100, 512), (1, 3, 7, 24)):
        broken = split(prompts, generations, batch, dp, micro, logprob)
        changes = repair(broken)
        fixed = Split(
            prompts=changes.get(PROMPTS, prompts),
            generations=generations,
            global_batch=changes.get(GLOBAL_BATCH, batch),
            data_parallel=dp,
            micro_batch=changes.get(MICRO_BATCH, micro),
            logprob_batch=changes.get(LOGPROB_BATCH, logprob),
        )
        assert fixed.problems() == [], (broken, changes)
