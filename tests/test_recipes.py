"""Each recipe's prepare (and loss) on a small hand-written batch, with hand-computed numbers.

The math itself has its own tests (test_algorithms_*); these check the wiring around it: which rows
learn, the masks, which log-probs are attached, dynamic sampling and overlong filtering.
"""

import math

import pytest
import torch

from rlsteps.contract.config import GRPOConfig, ReinforceConfig, RSConfig
from rlsteps.engine.algorithms import RECIPES
from rlsteps.engine.algorithms.grpo import GRPO
from rlsteps.engine.algorithms.recipe import ROW_MASK, loss_mask
from rlsteps.engine.algorithms.reinforce import ReinforceRLOO
from rlsteps.engine.algorithms.rs import RejectionSampling
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.rewards.scores import Scores

PAD = 0
ROOT2 = math.sqrt(2)


def _close(actual: torch.Tensor, expected: list, abs: float = 1e-6) -> None:
    assert actual.flatten().tolist() == pytest.approx(torch.tensor(expected).flatten().tolist(), abs=abs)


def make_batch(prompt_ids: list[str], response_lengths: list[int], is_end: list[bool], prompt_length: int = 2):
    """Prompt tokens 1..prompt_length, then row i's response tokens 10*(i+1)+j; right-padded with 0."""
    rows = [
        list(range(1, prompt_length + 1)) + [10 * (i + 1) + j for j in range(r)] for i, r in enumerate(response_lengths)
    ]
    width = max(map(len, rows))
    tokens = torch.tensor([row + [PAD] * (width - len(row)) for row in rows])
    return RolloutBatch(
        tokens=tokens,
        prompt_lengths=torch.full((len(rows),), prompt_length),
        pad_id=PAD,
        response_lengths=torch.tensor(response_lengths),
        is_end=torch.tensor(is_end),
        prompt_ids=prompt_ids,
        prompt_texts=[f"prompt {p}" for p in prompt_ids],
        response_texts=[f"response {i}" for i in range(len(rows))],
    )


def scores(rewards: list[float], valid: list[bool] | None = None) -> Scores:
    valid = [True] * len(rewards) if valid is None else valid
    return Scores(rewards=torch.tensor(rewards), valid=torch.tensor(valid))


def policy_logprobs(batch: RolloutBatch) -> torch.Tensor:  # a pure function of the rows: [B, T-1]
    return -0.01 * batch.tokens[:, 1:].float()


def reference_logprobs(batch: RolloutBatch) -> torch.Tensor:
    return -0.02 * batch.tokens[:, 1:].float()


def never_called(batch: RolloutBatch) -> torch.Tensor:
    raise AssertionError("this recipe must not ask for these log-probs")


def config(schema, algorithm: str, rollouts: dict, **sections):
    return schema.model_validate(
        {
            "algorithm": algorithm,
            "inputs": {"prompts": "p.jsonl", "policy": "sft"},
            "output": {"dir": "out"},
            "rollout": rollouts,
            **sections,
        }
    )


SEVERAL_STEPS = {"global_batch_size": 2, "micro_batch_size": 1}  # 4 rows: two optimizer steps, so prepare's pass
ONE_STEP = {"global_batch_size": 4, "micro_batch_size": 2}  # the policy's log-probs from the update's forward


# --- the registry ------------------------------------------------------------------------------


def test_every_algorithm_name_has_its_recipe():
    assert RECIPES == {"rs": RejectionSampling, "reinforce": ReinforceRLOO, "grpo": GRPO}


# --- rejection sampling ------------------------------------------------------------------------


def rs_recipe(top_n: int = 1) -> RejectionSampling:
    rollouts = {"prompts_per_step": 2, "num_rollouts_per_prompt": 2, "top_n_rollouts": top_n}
    return RejectionSampling(config(RSConfig, "rs", rollouts))


def test_rs_keeps_the_best_rollout_per_prompt_and_the_later_one_on_a_tie():
    batch = make_batch(["a", "a", "b", "b"], response_lengths=[2, 1, 3, 2], is_end=[True, True, False, True])
    recipe = rs_recipe()
    selected, stats = recipe.prepare(batch, scores([1.0, 3.0, 2.0, 2.0]), never_called, never_called)

    assert selected.prompt_ids == ["a", "b"] and selected.response_texts == ["response 1", "response 3"]
    assert selected.tokens.tolist() == [[1, 2, 20, 0], [1, 2, 40, 41]]  # trimmed to the longest kept row
    _close(selected.extras[ROW_MASK], [1.0, 1.0])
    assert stats["train/selected_reward_mean"] == pytest.approx(2.5)
    assert stats["train/reward"] == pytest.approx(2.0) and stats["train/fraction_ended"] == pytest.approx(0.75)
    assert recipe.train_rows_per_step() == 2
    assert recipe.loss_normaliser(selected) == 3  # response tokens, EOS included: 1 + 2


def test_rs_never_selects_an_unscored_rollout():
    batch = make_batch(["a", "a", "b", "b"], response_lengths=[2, 1, 3, 2], is_end=[True] * 4)
    selected, stats = rs_recipe().prepare(
        batch, scores([1.0, 9.0, 2.0, 0.0], valid=[True, False, True, True]), never_called, never_called
    )
    assert selected.response_texts == ["response 0", "response 2"]
    assert stats["train/fraction_scored"] == pytest.approx(0.75)


def test_rs_loss_is_the_token_mean_nll_of_the_kept_rows():
    batch = make_batch(["a", "a", "b", "b"], response_lengths=[2, 1, 3, 2], is_end=[True] * 4)
    recipe = rs_recipe()
    selected, _ = recipe.prepare(batch, scores([1.0, 3.0, 2.0, 2.0]), never_called, never_called)
    logprobs = torch.tensor([[-9.0, -0.5, -9.0], [-9.0, -1.0, -2.0]])  # only response positions count
    loss, stats = recipe.loss(logprobs, selected, recipe.loss_normaliser(selected))
    assert loss.item() == pytest.approx((0.5 + 1.0 + 2.0) / 3)
    assert stats["tokens"] == 3


# --- REINFORCE with the RLOO baseline ----------------------------------------------------------


def test_reinforce_folds_the_kl_into_the_reward_and_only_ended_rows_learn():
    # one prompt, four rollouts; prompt length 1, so entry t of a [4, 2] log-prob row scores response token t
    batch = make_batch(["p"] * 4, response_lengths=[1, 2, 1, 2], is_end=[True, True, True, False], prompt_length=1)
    logp = torch.full((4, 2), -1.0)
    logp_init = torch.tensor([[-1.2, 0.0], [-1.4, -1.4], [-1.0, 0.0], [-1.6, -1.6]])  # |kl| per row: .2 .4 0 .6
    cfg = config(
        ReinforceConfig,
        "reinforce",
        {"prompts_per_step": 1, "num_rollouts_per_prompt": 4},
        reinforce={"initial_policy_kl_penalty": 0.5, "use_absolute_kl": True},
        train=SEVERAL_STEPS,
    )
    recipe = ReinforceRLOO(cfg)
    prepared, stats = recipe.prepare(batch, scores([2.0, 7.0, -1.0, 0.0]), lambda b: logp, lambda b: logp_init)

    # R = r - 0.5 kl = [1.9, 6.8, -1.0, -0.3]; b_i = mean of the other ended R_j; the unended row's b is the
    # mean of all ended rows (7.7 / 3)
    _close(prepared.extras["advantages"], [1.9 - 2.9, 6.8 - 0.45, -1.0 - 4.35, -0.3 - 7.7 / 3], abs=1e-5)
    _close(prepared.extras[ROW_MASK], [1.0, 1.0, 1.0, 0.0])
    assert stats["train/rewards_with_kl"] == pytest.approx(1.85)
    assert stats["train/init_policy_kl"] == pytest.approx(0.3)
    assert recipe.needs_reference

    normaliser = recipe.loss_normaliser(prepared)
    assert normaliser == 4  # 1 + 2 + 1 tokens; the unended row's 2 tokens stay out
    loss, _ = recipe.loss(torch.full((4, 2), -1.0), prepared, normaliser)
    assert loss.item() == pytest.approx((-1.0 * 1 + 6.35 * 2 - 5.35 * 1) / 4, abs=1e-5)


def test_reinforce_masks_an_unscored_row():
    batch = make_batch(["p"] * 3, response_lengths=[1, 1, 1], is_end=[True] * 3, prompt_length=1)
    cfg = config(
        ReinforceConfig,
        "reinforce",
        {"prompts_per_step": 1, "num_rollouts_per_prompt": 3},
        reinforce={"initial_policy_kl_penalty": 0.0},
        train=SEVERAL_STEPS,
    )
    prepared, _ = ReinforceRLOO(cfg).prepare(
        batch, scores([1.0, 0.0, 3.0], valid=[True, False, True]), policy_logprobs, reference_logprobs
    )
    _close(prepared.extras[ROW_MASK], [1.0, 0.0, 1.0])
    _close(prepared.extras["advantages"][[0, 2]], [1.0 - 3.0, 3.0 - 1.0])  # the unscored row is no one's peer


# --- GRPO --------------------------------------------------------------------------------------


def grpo_recipe(train=SEVERAL_STEPS, **grpo) -> GRPO:
    cfg = config(
        GRPOConfig,
        "grpo",
        {"prompts_per_step": 2, "num_rollouts_per_prompt": 2},
        grpo={"leave_one_out": False, "normalize_std": True, **grpo},
        train=train,
    )
    return GRPO(cfg)


def grpo_batch(is_end=(True, True, True, True)) -> RolloutBatch:
    return make_batch(["a", "a", "b", "b"], response_lengths=[2, 1, 3, 2], is_end=list(is_end))


def test_grpo_attaches_group_advantages_and_the_old_and_reference_logprobs():
    batch = grpo_batch()
    recipe = grpo_recipe(kl_beta=0.01)
    prepared, stats = recipe.prepare(batch, scores([1.0, 3.0, 2.0, 2.0]), policy_logprobs, reference_logprobs)

    _close(prepared.extras["advantages"], [-1 / ROOT2, 1 / ROOT2, 0.0, 0.0])  # group b has zero variance
    _close(prepared.extras[ROW_MASK], [1.0] * 4)
    assert torch.equal(prepared.extras["old_logprobs"], policy_logprobs(batch))
    assert torch.equal(prepared.extras["ref_logprobs"], reference_logprobs(batch))
    assert stats["train/fraction_masked"] == 0.0 and stats["train/advantage_mean"] == pytest.approx(0.0)
    assert "train/fraction_dropped_zero_variance" not in stats


def test_grpo_without_kl_needs_no_reference_policy():
    recipe = grpo_recipe(kl_beta=0.0)
    prepared, _ = recipe.prepare(grpo_batch(), scores([1.0, 3.0, 2.0, 2.0]), policy_logprobs, never_called)
    assert not recipe.needs_reference and "ref_logprobs" not in prepared.extras


def test_grpo_dynamic_sampling_drops_zero_variance_groups_before_the_logprobs():
    recipe = grpo_recipe(kl_beta=0.01, dynamic_sampling=True)
    prepared, stats = recipe.prepare(grpo_batch(), scores([1.0, 3.0, 2.0, 2.0]), policy_logprobs, reference_logprobs)

    assert prepared.prompt_ids == ["a", "a"] and prepared.tokens.shape == (2, 4)
    assert stats["train/fraction_dropped_zero_variance"] == pytest.approx(0.5)
    _close(prepared.extras["advantages"], [-1 / ROOT2, 1 / ROOT2])
    _close(prepared.extras[ROW_MASK], [1.0, 1.0])
    assert torch.equal(prepared.extras["old_logprobs"], policy_logprobs(prepared))  # of the kept rows only
    assert torch.equal(prepared.extras["ref_logprobs"], reference_logprobs(prepared))


@pytest.mark.parametrize(
    "overlong_filtering, advantages, row_mask",
    [
        (True, [-1 / ROOT2, 1 / ROOT2, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]),  # b: one valid row left: no advantage
        (False, [-1 / ROOT2, 1 / ROOT2, -1 / ROOT2, 1 / ROOT2], [1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_grpo_overlong_filtering_masks_rows_that_did_not_end(overlong_filtering, advantages, row_mask):
    batch = grpo_batch(is_end=(True, True, True, False))
    recipe = grpo_recipe(kl_beta=0.0, overlong_filtering=overlong_filtering)
    prepared, stats = recipe.prepare(batch, scores([1.0, 3.0, 2.0, 5.0]), policy_logprobs, never_called)
    _close(prepared.extras["advantages"], advantages)
    _close(prepared.extras[ROW_MASK], row_mask)
    assert stats["train/fraction_masked"] == pytest.approx(1.0 - sum(row_mask) / 4)
    assert recipe.loss_normaliser(prepared) == sum(n * m for n, m in zip([2, 1, 3, 2], row_mask))


def test_grpo_loss_clips_the_ratio_with_the_configured_epsilons():
    recipe = grpo_recipe(kl_beta=0.0, eps_low=0.2, eps_high=0.2)
    prepared, _ = recipe.prepare(grpo_batch(), scores([1.0, 3.0, 2.0, 2.0]), policy_logprobs, never_called)
    normaliser = recipe.loss_normaliser(prepared)
    assert normaliser == 8  # every row learns (group b with advantage 0): 2 + 1 + 3 + 2 tokens

    ratio = math.exp(0.5)  # every token's log-prob moved up by 0.5 from the old policy
    loss, _ = recipe.loss(prepared.extras["old_logprobs"] + 0.5, prepared, normaliser)
    a = 1 / ROOT2
    row0 = max(a * ratio, a * 1.2)  # A < 0: the unclipped term is the larger
    row1 = max(-a * ratio, -a * 1.2)  # A > 0: clipped at 1 + eps_high
    assert loss.item() == pytest.approx((row0 * 2 + row1 * 1) / normaliser, abs=1e-6)


def test_loss_mask_is_the_response_mask_times_the_row_mask():
    batch = grpo_batch()
    batch.extras[ROW_MASK] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert loss_mask(batch).tolist() == [[0, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0]]


# --- one optimizer step: the policy's log-probs from the update's forward ----------------------


def test_grpo_with_one_optimizer_step_runs_no_policy_pass_and_its_ratio_is_one():
    one = grpo_recipe(train=ONE_STEP, kl_beta=0.01)
    two = grpo_recipe(train=SEVERAL_STEPS, kl_beta=0.01)
    assert one.logprobs_from_update() and not two.logprobs_from_update()
    fused, stats = one.prepare(grpo_batch(), scores([1.0, 3.0, 2.0, 2.0]), never_called, reference_logprobs)
    assert "old_logprobs" not in fused.extras and "train/token_mult_prob_error" not in stats
    assert torch.equal(fused.extras["ref_logprobs"], reference_logprobs(grpo_batch()))
    separate, _ = two.prepare(grpo_batch(), scores([1.0, 3.0, 2.0, 2.0]), policy_logprobs, reference_logprobs)

    logprobs = policy_logprobs(grpo_batch()).requires_grad_()  # the forward's log-probs, on the weights that sampled
    normaliser = one.loss_normaliser(fused)
    loss_one, stats_one = one.loss(logprobs, fused, normaliser)
    (grad_one,) = torch.autograd.grad(loss_one, logprobs)
    loss_two, stats_two = two.loss(logprobs, separate, normaliser)
    (grad_two,) = torch.autograd.grad(loss_two, logprobs)
    assert torch.equal(loss_one, loss_two) and torch.equal(grad_one, grad_two)
    assert stats_one == stats_two and stats_one["ratio_max"] == 1.0


def test_grpo_with_several_optimizer_steps_refuses_a_batch_without_old_logprobs():
    recipe = grpo_recipe(train=ONE_STEP, kl_beta=0.0)
    prepared, _ = recipe.prepare(grpo_batch(), scores([1.0, 3.0, 2.0, 2.0]), never_called, never_called)
    with pytest.raises(KeyError, match="old_logprobs"):
        grpo_recipe(train=SEVERAL_STEPS, kl_beta=0.0).loss(policy_logprobs(prepared), prepared, 8.0)


def test_the_two_pass_switch_keeps_the_separate_pass_with_one_optimizer_step():
    recipe = grpo_recipe(train=ONE_STEP, kl_beta=0.0)
    recipe.two_pass = True
    assert not recipe.logprobs_from_update()
    prepared, _ = recipe.prepare(grpo_batch(), scores([1.0, 3.0, 2.0, 2.0]), policy_logprobs, never_called)
    assert torch.equal(prepared.extras["old_logprobs"], policy_logprobs(prepared))


def reinforce_recipe(train: dict, per_prompt: int = 2) -> ReinforceRLOO:
    rollouts = {"prompts_per_step": 4 // per_prompt, "num_rollouts_per_prompt": per_prompt}
    reinforce = {"initial_policy_kl_penalty": 0.5, "use_absolute_kl": False}
    return ReinforceRLOO(config(ReinforceConfig, "reinforce", rollouts, reinforce=reinforce, train=train))


def test_reinforce_with_one_optimizer_step_makes_the_advantages_in_the_loss_from_the_forward():
    batch = lambda: grpo_batch(is_end=(True, True, False, True))  # noqa: E731
    rewards = scores([1.0, 3.0, 2.0, 5.0], valid=[True, True, True, True])
    one, two = reinforce_recipe(ONE_STEP), reinforce_recipe(SEVERAL_STEPS)
    assert one.logprobs_from_update() and not two.logprobs_from_update()
    fused, fused_stats = one.prepare(batch(), rewards, never_called, reference_logprobs)
    separate, separate_stats = two.prepare(batch(), rewards, policy_logprobs, reference_logprobs)
    assert "advantages" not in fused.extras and "advantages" in separate.extras

    trainer = policy_logprobs(batch())
    assert {**fused_stats, **one.update_stats(fused, trainer)} == pytest.approx(separate_stats)
    normaliser = one.loss_normaliser(fused)
    assert normaliser == two.loss_normaliser(separate) == 5  # the unended row of group b stays out
    for rows in ([0, 1], [2, 3]):  # micro-batches of whole groups, as the update runs them
        logprobs = policy_logprobs(batch().select(rows)).requires_grad_()
        loss_one, stats_one = one.loss(logprobs, fused.select(rows), normaliser)
        (grad_one,) = torch.autograd.grad(loss_one, logprobs)
        loss_two, stats_two = two.loss(logprobs, separate.select(rows), normaliser)
        (grad_two,) = torch.autograd.grad(loss_two, logprobs)
        assert torch.equal(loss_one, loss_two) and torch.equal(grad_one, grad_two) and stats_one == stats_two


def test_reinforce_keeps_the_separate_pass_when_a_micro_batch_splits_a_group():
    assert reinforce_recipe({"global_batch_size": 4, "micro_batch_size": 4}, per_prompt=2).logprobs_from_update()
    assert reinforce_recipe({"global_batch_size": 4, "micro_batch_size": 4}, per_prompt=4).logprobs_from_update()
    split = reinforce_recipe({"global_batch_size": 4, "micro_batch_size": 1}, per_prompt=2)
    assert not split.logprobs_from_update()
    prepared, _ = split.prepare(grpo_batch(), scores([1.0, 3.0, 2.0, 5.0]), policy_logprobs, reference_logprobs)
    assert "advantages" in prepared.extras and "ref_logprobs" not in prepared.extras


def test_rs_with_one_optimizer_step_leaves_the_sampler_comparison_to_the_update():
    batch = make_batch(["a", "a", "b", "b"], response_lengths=[2, 1, 3, 2], is_end=[True] * 4)
    batch.gen_logprobs = policy_logprobs(batch) - 0.1
    recipe = rs_recipe()
    assert recipe.logprobs_from_update()
    selected, stats = recipe.prepare(batch, scores([1.0, 3.0, 2.0, 2.0]), never_called, never_called)
    assert "train/token_mult_prob_error" not in stats
    gap = recipe.update_stats(selected, policy_logprobs(selected))["train/token_mult_prob_error"]
    assert gap == pytest.approx(math.exp(0.1))
