"""GRPO's and REINFORCE-RLOO's maths against other implementations' own code, on the same random rows.

Oracles:
- NeMo-RL v0.7.0 (the pinned source, tests/nemo_rl_maths_check.py in a process of its own):
  nemo_rl.algorithms.utils.calculate_baseline_and_std_per_prompt and calculate_kl,
  nemo_rl.algorithms.advantage_estimator.GRPOAdvantageEstimator, nemo_rl.algorithms.loss.loss_functions.ClippedPGLossFn.
- TRL (the `test` extra): GRPOTrainer._compute_loss and RLOOTrainer._compute_loss, called on prepared inputs with a
  trainer object that holds what their __init__ sets from GRPOConfig / RLOOConfig; the log-probs the model would give
  are handed in, so TRL's own loss code runs on exactly the rlsteps rows.

Rows: several prompts, groups of 4-8 interleaved in the batch, some samples not properly ended, response masks with a
prompt part and right padding. The differences docs list (the std floor, the leave-one-out baseline over ended
samples only, the KL folded into REINFORCE's reward) are asserted as differences, with the numbers on both sides.
"""

import contextlib
import json
import subprocess
import sys
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import required
import upstream
from rlsteps.engine.algorithms.groups import group_mean, group_std, leave_one_out_mean, leave_one_out_std
from rlsteps.engine.algorithms.grpo import clipped_policy_loss, group_advantages, k3_kl
from rlsteps.engine.algorithms.reinforce import reinforce_loss, rloo_baseline

# TrainingArguments (under GRPOConfig and RLOOConfig) warns about its own deprecated field on every construction
pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")

CHECK = Path(__file__).with_name("nemo_rl_maths_check.py")
WIDTH = 14  # tokens per row: next-token positions are WIDTH - 1


def make_rows(seed: int, prompts: int = 6) -> dict:
    """Random rows: groups of 4-8 interleaved; group 0 all ended, group 1 with one unended sample, the rest random."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(4, 9, (prompts,), generator=g)
    prompt = torch.cat([torch.full((int(n),), p) for p, n in enumerate(sizes)])
    order = torch.randperm(len(prompt), generator=g)
    prompt = prompt[order]
    b = len(prompt)
    ended = torch.rand(b, generator=g) > 0.3
    ended[prompt == 0] = True
    ended[prompt == 1] = True
    ended[torch.nonzero(prompt == 1)[0]] = False
    prompt_len = torch.randint(1, 4, (b,), generator=g)
    response_len = torch.randint(1, WIDTH - 3, (b,), generator=g)
    positions = torch.arange(1, WIDTH)[None, :]
    mask = ((positions >= prompt_len[:, None]) & (positions < (prompt_len + response_len)[:, None])).float()
    logprobs = -torch.rand(b, WIDTH - 1, generator=g) * 3  # [B, T-1]
    return {
        "prompt": prompt,
        "group": torch.unique(prompt, return_inverse=True)[1],
        "rewards": torch.randn(b, generator=g),
        "ended": ended,
        "mask": mask,
        "logprobs": logprobs,
        # old policy: ratios from about 0.55 to 1.8, so both clips bind on some tokens
        "old": logprobs + (torch.rand(b, WIDTH - 1, generator=g) - 0.5) * 1.2,
        "reference": logprobs + (torch.rand(b, WIDTH - 1, generator=g) - 0.5) * 2.0,
    }


ROWS = make_rows(0)


# (temperature, top_k, top_p) of a rollout.sampling: each row's targets drawn from that very distribution
SAMPLED_SETTINGS = [(0.7, 0, 1.0), (1.3, 0, 1.0), (0.7, 6, 1.0), (0.7, 0, 0.85), (1.3, 8, 0.8)]
SAMPLED_ROWS, SAMPLED_VOCAB = 24, 40


def sampled_rows(temperature: float, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits [N, V] of a peaked distribution, a target per row drawn by the built-in sampler at these settings, and
    a weight per row (the gradient of sum(w * logp) is compared, not only of their sum)."""
    from rlsteps.engine.generation.backend import SamplingParams
    from rlsteps.engine.generation.sampling import sample_next_token

    g = torch.Generator().manual_seed(int(temperature * 100) + top_k + int(top_p * 100))
    logits = torch.randn(SAMPLED_ROWS, SAMPLED_VOCAB, generator=g) * 2.5
    params = SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p, top_k=top_k)
    targets = sample_next_token(logits, params, torch.rand(SAMPLED_ROWS, generator=g).clamp(1e-6, 1 - 1e-6))
    return logits, targets, torch.randn(SAMPLED_ROWS, generator=g)


def sampled_call(temperature: float, top_k: int, top_p: float) -> dict:
    logits, targets, weights = sampled_rows(temperature, top_k, top_p)
    return {"fn": "sampled", "logits": as_list(logits), "targets": targets.tolist(), "weights": as_list(weights),
            "t": temperature, "top_k": top_k, "top_p": top_p}  # fmt: skip


def far_reference(rows: dict) -> dict:
    """The rows with a reference up to 30 nats from the policy: |log r| of 30, 25 and 21 (past the input clamp of 20),
    3 and -12 (k3 of 16.1 and 11.0: past the output clamp of 10) and 0.5 (neither), on every row's first tokens."""
    offsets = torch.tensor([30.0, -30.0, 25.0, -21.0, 3.0, -12.0, 0.5])
    reference = rows["reference"].clone()
    reference[:, 1 : 1 + len(offsets)] = rows["logprobs"][:, 1 : 1 + len(offsets)] + offsets
    return rows | {"reference": reference}


def nemo_rl(calls: list[dict]) -> list:
    """NeMo-RL's own functions on the calls (tests/nemo_rl_maths_check.py, in a process of its own)."""
    upstream.unpacked("nemo_rl")  # skips (or fails under RLSTEPS_REQUIRE_UPSTREAM=1) without the archive
    done = subprocess.run(
        [sys.executable, str(CHECK)], input=json.dumps(calls), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def as_list(t: torch.Tensor) -> list:
    return t.float().tolist()


def close(actual, expected, rel: float = 1e-5, abs: float = 1e-6) -> bool:
    return torch.allclose(torch.as_tensor(actual).float(), torch.as_tensor(expected).float(), rtol=rel, atol=abs)


# -------------------------------------------------------------------------------------------------------------------
# NeMo-RL: every call of the module's tests goes to one process


def _loss_call(config: dict, rows: dict, advantages: torch.Tensor, row_mask: torch.Tensor, split: int) -> dict:
    micro = []
    for part in (slice(0, split), slice(split, None)):
        micro.append(
            {
                "logprobs": as_list(rows["logprobs"][part]),
                "prev": as_list(rows["old"][part]),
                "reference": as_list(rows["reference"][part]),
                "token_mask": as_list(rows["mask"][part]),
                "advantages": as_list(advantages[part]),
                "sample_mask": as_list(row_mask[part]),
            }
        )
    return {
        "fn": "loss",
        "config": config,
        "micro_batches": micro,
        "global_valid_seqs": float(row_mask.sum()),
        "global_valid_toks": float((rows["mask"] * row_mask[:, None]).sum()),
    }


def near_constant_rows() -> dict:
    """Three groups: rewards 1e-4 apart around 0, constant at 0.7, 3e-4 apart around 3."""
    rewards = torch.tensor([0.0, 1e-4, -1e-4, 0.0, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 3.0, 3.0003, 2.9997, 3.0])
    prompt = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2])
    return {"prompt": prompt, "group": prompt, "rewards": rewards}


def _calls() -> dict[str, dict]:
    r, every = ROWS, torch.ones(len(ROWS["rewards"]))
    ended = ROWS["ended"].float()
    grpo_adv = group_advantages(r["rewards"], r["group"], r["ended"], leave_one_out=False, normalize_std=True)
    reinforce_adv = r["rewards"] - rloo_baseline(r["rewards"], r["group"], r["ended"])
    calls = {
        f"baseline {loo} {name}": {
            "fn": "baseline",
            "prompts": r["prompt"].tolist(),
            "rewards": as_list(r["rewards"]),
            "valid": as_list(valid),
            "leave_one_out": loo,
        }
        for loo in (False, True)
        for name, valid in (("every", every), ("ended", ended))
    }
    calls |= {
        f"advantages {loo} {normalize}": {
            "fn": "advantages",
            "prompts": r["prompt"].tolist(),
            "rewards": as_list(r["rewards"]),
            "leave_one_out": loo,
            "normalize": normalize,
        }
        for loo in (False, True)
        for normalize in (False, True)
    }
    flat = near_constant_rows()
    calls["advantages near-constant"] = {
        "fn": "advantages",
        "prompts": flat["prompt"].tolist(),
        "rewards": as_list(flat["rewards"]),
        "leave_one_out": False,
        "normalize": True,
    }
    extreme = r["reference"].clone()
    extreme[0, :4] = r["logprobs"][0, :4] + torch.tensor([25.0, -25.0, 3.0, -12.0])  # both clamps bind
    calls["kl"] = {"fn": "kl", "logprobs": as_list(r["logprobs"]), "reference": as_list(extreme)}
    grpo_cfg = {"ratio_clip_min": 0.2, "ratio_clip_max": 0.28, "token_level_loss": True}
    for beta in (0.0, 0.05):
        calls[f"grpo loss {beta}"] = _loss_call(
            grpo_cfg | {"reference_policy_kl_penalty": beta}, r, grpo_adv, ended, split=len(ended) // 3
        )
    calls["grpo loss 0.05 far"] = _loss_call(
        grpo_cfg | {"reference_policy_kl_penalty": 0.05}, far_reference(r), grpo_adv, ended, split=len(ended) // 3
    )
    for settings in SAMPLED_SETTINGS:
        calls[f"sampled {settings}"] = sampled_call(*settings)
    reinforce_cfg = {"disable_ppo_ratio": True, "token_level_loss": True}
    for beta in (0.0, 0.05):
        calls[f"reinforce loss {beta}"] = _loss_call(
            reinforce_cfg | {"reference_policy_kl_penalty": beta}, r, reinforce_adv, ended, split=len(ended) // 2
        )
    return calls


@pytest.fixture(scope="module")
def upstream_results() -> dict:
    calls = _calls()
    return dict(zip(calls, nemo_rl(list(calls.values())), strict=True))


def test_group_mean_baseline_and_std_equal_nemo_rls(upstream_results):
    """calculate_baseline_and_std_per_prompt(leave_one_out_baseline=False) with every sample counted, as grpo_train
    calls it: rlsteps's group mean and unbiased group std are NeMo-RL's baseline and std."""
    r, counted = ROWS, torch.ones_like(ROWS["ended"])
    got = upstream_results["baseline False every"]
    assert close(group_mean(r["rewards"], r["group"], counted), got["baseline"])
    assert close(group_std(r["rewards"], r["group"], counted), got["std"])


def test_leave_one_out_baseline_and_std_equal_nemo_rls(upstream_results):
    """leave_one_out_baseline=True, every sample counted: the mean and std of the others are NeMo-RL's."""
    r, counted = ROWS, torch.ones_like(ROWS["ended"])
    got = upstream_results["baseline True every"]
    assert close(leave_one_out_mean(r["rewards"], r["group"], counted), got["baseline"])
    assert close(leave_one_out_std(r["rewards"], r["group"], counted), got["std"], abs=1e-5)


def test_baselines_over_ended_samples_equal_nemo_rls_valid_mask_on_the_samples_that_count(upstream_results):
    """With valid_mask = ended, NeMo-RL's function and rlsteps's agree on every ended sample (both the group mean and
    the leave-one-out mean and std). On an unended sample they differ, by design: rlsteps gives it the mean of the
    ended samples (sum / n), NeMo-RL's leave-one-out divides that sum by n - 1 for every row (the NeMo-Aligner
    formula engine/algorithms/reinforce.py names); such a sample carries no gradient in rlsteps either way."""
    r, ended = ROWS, ROWS["ended"]
    plain, loo = upstream_results["baseline False ended"], upstream_results["baseline True ended"]
    assert close(group_mean(r["rewards"], r["group"], ended), plain["baseline"])
    assert close(group_std(r["rewards"], r["group"], ended), plain["std"])
    ours, theirs = rloo_baseline(r["rewards"], r["group"], ended), torch.tensor(loo["baseline"])
    assert close(ours[ended], theirs[ended])
    assert close(leave_one_out_std(r["rewards"], r["group"], ended)[ended], torch.tensor(loo["std"])[ended], abs=1e-5)
    n = torch.zeros(int(r["group"].max()) + 1).index_add_(0, r["group"], ended.float())[r["group"]]
    unended = ~ended
    assert unended.sum() >= 2
    assert close(ours[unended], group_mean(r["rewards"], r["group"], ended)[unended])
    assert close(theirs[unended], ours[unended] * n[unended] / (n[unended] - 1))
    assert not close(theirs[unended], ours[unended])


@pytest.mark.parametrize("leave_one_out", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_grpo_advantages_equal_nemo_rls_estimator_when_every_sample_ended(upstream_results, leave_one_out, normalize):
    """GRPOAdvantageEstimator (use_leave_one_out_baseline, normalize_rewards), every sample counted. NeMo-RL divides
    by std + 1e-6, rlsteps by std: within 1e-5 relative where the std is of order one, as on these rows."""
    r = ROWS
    ours = group_advantages(
        r["rewards"], r["group"], torch.ones_like(r["ended"]), leave_one_out=leave_one_out, normalize_std=normalize
    )
    assert close(ours, upstream_results[f"advantages {leave_one_out} {normalize}"], abs=1e-5)


def test_overlong_filtering_leaves_unended_samples_out_of_the_baseline_where_nemo_rl_keeps_them(upstream_results):
    """rl/rlhf with overlong_filtering: rlsteps's rows that count are the ended ones, for the loss and the baseline.
    NeMo-RL's grpo_train drops a truncated sample from the loss (loss_multiplier 0) but its estimator still counts
    it in the group's mean and std. Equal on groups where every sample ended; different on the ended samples of a
    group with an unended one, where rlsteps's value is NeMo-RL's baseline function over the ended samples only."""
    r, ended = ROWS, ROWS["ended"]
    ours = group_advantages(r["rewards"], r["group"], ended, leave_one_out=False, normalize_std=True)
    theirs = torch.tensor(upstream_results["advantages False True"])
    group_all_ended = torch.zeros(int(r["group"].max()) + 1).index_add_(0, r["group"], (~ended).float()) == 0
    clean = group_all_ended[r["group"]]
    assert clean.any() and (~clean & ended).any()
    assert close(ours[clean], theirs[clean], abs=1e-5)
    mixed = ~clean & ended
    assert (ours[mixed] - theirs[mixed]).abs().min() > 1e-3
    plain = upstream_results["baseline False ended"]  # NeMo-RL's function, valid_mask = ended
    expected = (r["rewards"] - torch.tensor(plain["baseline"])) / torch.tensor(plain["std"])
    assert close(ours[ended], expected[ended], abs=1e-5)
    assert (ours[~ended] == 0).all()


def test_rloo_advantages_over_ended_samples_only_where_nemo_rl_counts_every_sample(upstream_results):
    """rl/reinforce maps to NeMo-RL's GRPO with use_leave_one_out_baseline and no std normalisation. Equal on groups
    where every sample ended; on a group with an unended sample, rlsteps's leave-one-out baseline of an ended sample
    leaves the unended one out (docs), so the advantages differ there."""
    r, ended = ROWS, ROWS["ended"]
    ours = r["rewards"] - rloo_baseline(r["rewards"], r["group"], ended)
    theirs = torch.tensor(upstream_results["advantages True False"])
    clean = (torch.zeros(int(r["group"].max()) + 1).index_add_(0, r["group"], (~ended).float()) == 0)[r["group"]]
    assert close(ours[clean], theirs[clean])
    mixed = ~clean & ended
    assert (ours[mixed] - theirs[mixed]).abs().min() > 1e-3


def test_the_std_floor_keeps_a_near_constant_group_unscaled_where_nemo_rl_scales_it(upstream_results):
    """The docs' std floor: NeMo-RL divides by (std + 1e-6) whenever std > 0, so rewards 1e-4 apart (std 8.2e-5)
    become advantages of +-1.21; rlsteps leaves a group whose std is under the floor (1e-3) unscaled: r - mean, 1e-4.
    Where the difference does not apply they agree: a constant group gives 0 in both, and so does nothing but r - mean
    the group around 3, whose std (1.7e-4) NeMo-RL's E[r^2] - E[r]^2 in float32 rounds to 0."""
    flat = near_constant_rows()
    every = torch.ones_like(flat["prompt"], dtype=torch.bool)
    ours = group_advantages(flat["rewards"], flat["group"], every, leave_one_out=False, normalize_std=True)
    theirs = torch.tensor(upstream_results["advantages near-constant"])
    near = flat["prompt"] == 0
    assert close(ours[near], [0.0, 1e-4, -1e-4, 0.0], abs=1e-9)
    assert close(theirs[near], [0.0, 1.2099, -1.2099, 0.0], abs=1e-4)  # 1e-4 / (8.165e-5 + 1e-6)
    assert close(ours[~near], theirs[~near], abs=1e-7)
    assert (ours[flat["prompt"] == 1] == 0).all()


def test_k3_kl_equals_nemo_rls_calculate_kl_with_its_clamps(upstream_results):
    """k3 = exp(logr) - 1 - logr, logr = ref - logp clamped to [-20, 20], the result to [-10, 10]: NeMo-RL's
    calculate_kl defaults; rows 0's first tokens are past both clamps."""
    r = ROWS
    reference = r["reference"].clone()
    reference[0, :4] = r["logprobs"][0, :4] + torch.tensor([25.0, -25.0, 3.0, -12.0])
    ours = k3_kl(r["logprobs"], reference)
    assert ours[0, 0] == 10.0 and ours[0, 1] == 10.0  # clamped
    assert close(ours, upstream_results["kl"])


def _rlsteps_grpo_loss(rows, advantages, row_mask, split, beta):
    """rlsteps's clipped loss over two micro-batches, each divided by the global batch's loss tokens; [B, T-1] grad."""
    logprobs = rows["logprobs"].clone().requires_grad_(True)
    mask = rows["mask"] * row_mask[:, None]
    normaliser = float(mask.sum())
    losses = []
    for part in (slice(0, split), slice(split, None)):
        loss, _ = clipped_policy_loss(
            logprobs[part],
            rows["old"][part],
            advantages[part],
            mask[part],
            normaliser,
            eps_low=0.2,
            eps_high=0.28,
            ref_logprobs=rows["reference"][part],
            kl_beta=beta,
        )
        loss.backward()
        losses.append(loss.item())
    return losses, logprobs.grad


def test_grpo_clipped_loss_and_token_normalisation_equal_nemo_rls_clipped_pg_loss(upstream_results):
    """ClippedPGLossFn(ratio_clip_min 0.2, ratio_clip_max 0.28, token_level_loss, no KL) per micro-batch with the
    global valid token count: rlsteps's loss and its gradient on every token, micro-batch by micro-batch."""
    r, ended = ROWS, ROWS["ended"]
    adv = group_advantages(r["rewards"], r["group"], ended, leave_one_out=False, normalize_std=True)
    losses, grad = _rlsteps_grpo_loss(r, adv, ended.float(), len(ended) // 3, beta=0.0)
    theirs = upstream_results["grpo loss 0.0"]
    assert close(losses, [m["loss"] for m in theirs])
    assert close(grad, torch.cat([torch.tensor(m["grad"]) for m in theirs]), abs=1e-8)


def test_grpo_k3_kl_term_equals_nemo_rls_in_value_and_gradient(upstream_results):
    """With reference_policy_kl_penalty 0.05: NeMo-RL multiplies the token's k3 by exp(logp - logp.detach()) (1 in
    value, the on-policy score-function term in the gradient), and so does rlsteps: loss values and gradients agree.
    Without that factor the gradient would lack exactly beta * k3_t / N on every loss token (asserted too)."""
    r, ended = ROWS, ROWS["ended"]
    adv = group_advantages(r["rewards"], r["group"], ended, leave_one_out=False, normalize_std=True)
    losses, grad = _rlsteps_grpo_loss(r, adv, ended.float(), len(ended) // 3, beta=0.05)
    theirs = upstream_results["grpo loss 0.05"]
    their_grad = torch.cat([torch.tensor(m["grad"]) for m in theirs])
    assert close(losses, [m["loss"] for m in theirs])
    assert close(grad, their_grad, abs=1e-8)
    mask = r["mask"] * ended.float()[:, None]
    score_term = 0.05 * k3_kl(r["logprobs"], r["reference"]) * mask / mask.sum()
    assert score_term.abs().max() > 1e-4  # the term the factor contributes is not negligible on these rows


def test_grpo_kl_term_in_the_clamped_region_equals_nemo_rls_in_value_and_gradient(upstream_results):
    """|log r| up to 30: NeMo-RL weights k3 by exp(logp - sg(logp)) before the output clamp and detaches the weight
    where the input clamp binds, so a token past either clamp adds a constant and no gradient, its score-function part
    included. rlsteps agrees token for token; clamping k3 first (its former order) left beta * 10 / N of gradient on
    every such token, pushing log p further from the reference (asserted: those tokens are in the rows)."""
    r, ended = far_reference(ROWS), ROWS["ended"]
    adv = group_advantages(r["rewards"], r["group"], ended, leave_one_out=False, normalize_std=True)
    losses, grad = _rlsteps_grpo_loss(r, adv, ended.float(), len(ended) // 3, beta=0.05)
    _, without_kl = _rlsteps_grpo_loss(r, adv, ended.float(), len(ended) // 3, beta=0.0)
    theirs = upstream_results["grpo loss 0.05 far"]
    assert close(losses, [m["loss"] for m in theirs])
    assert close(grad, torch.cat([torch.tensor(m["grad"]) for m in theirs]), abs=1e-8)
    clamped = torch.zeros_like(r["mask"], dtype=torch.bool)
    clamped[:, 1:7] = (r["mask"][:, 1:7] * ended.float()[:, None]).bool()  # the loss tokens of the offsets past a clamp
    assert clamped.sum() >= 10
    assert torch.equal(grad[clamped], without_kl[clamped])  # the KL term adds no gradient where a clamp binds


@pytest.mark.parametrize("settings", SAMPLED_SETTINGS, ids=lambda s: f"T{s[0]}-k{s[1]}-p{s[2]}")
def test_the_sampled_distributions_logprobs_and_gradient_equal_nemo_rls(upstream_results, settings):
    """Training scores a token under the distribution the sampler drew it from: logits / T, then top-k and top-p,
    renormalised, the filtered tokens without gradient. Against NeMo-RL's own apply_temperature_scaling and
    apply_top_k_top_p (its DTensor worker's path), value and gradient w.r.t. the logits, on tokens the built-in sampler
    drew at those settings; and not the raw log-probs training took before (the gap asserted)."""
    from rlsteps.engine.policy.sampled_distribution import SampledDistribution

    logits, targets, weights = sampled_rows(*settings)
    logits.requires_grad_(True)
    ours = SampledDistribution(*settings).logprobs(logits, targets)
    (ours * weights).sum().backward()
    theirs = upstream_results[f"sampled {settings}"]
    assert close(ours.detach(), theirs["logprobs"], abs=1e-5)
    assert close(logits.grad, theirs["grad"], abs=1e-6)
    raw = logits.detach().log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    assert (raw - ours.detach()).abs().max() > 0.05


def test_reinforce_loss_equals_nemo_rls_clipped_pg_loss_without_ratio(upstream_results):
    """ClippedPGLossFn(disable_ppo_ratio, no KL), the loss rl/reinforce compiles to: -A * logp over the ended samples'
    tokens / global tokens, equal in value and gradient per micro-batch."""
    r, ended = ROWS, ROWS["ended"]
    adv = r["rewards"] - rloo_baseline(r["rewards"], r["group"], ended)
    logprobs = r["logprobs"].clone().requires_grad_(True)
    mask = r["mask"] * ended.float()[:, None]
    split = len(ended) // 2
    losses = []
    for part in (slice(0, split), slice(split, None)):
        loss, _ = reinforce_loss(logprobs[part], adv[part], mask[part], float(mask.sum()))
        loss.backward()
        losses.append(loss.item())
    theirs = upstream_results["reinforce loss 0.0"]
    assert close(losses, [m["loss"] for m in theirs])
    assert close(logprobs.grad, torch.cat([torch.tensor(m["grad"]) for m in theirs]), abs=1e-8)


def test_reinforce_kl_is_folded_into_the_reward_where_nemo_rl_adds_k3_to_the_loss(upstream_results):
    """Docs: rlsteps folds beta * mean_t KL into the sequence reward; NeMo-RL's loss (reference_policy_kl_penalty
    0.05) adds beta * token-mean k3 to the loss. Pinned: NeMo-RL's loss with the KL minus without it is exactly
    beta * k3 over the loss tokens, a term rlsteps's loss never has (the same advantages give NeMo-RL's loss
    without the KL)."""
    r, ended = ROWS, ROWS["ended"]
    mask = r["mask"] * ended.float()[:, None]
    split = len(ended) // 2
    kl = 0.05 * k3_kl(r["logprobs"], r["reference"]) * mask / mask.sum()
    with_kl, without = upstream_results["reinforce loss 0.05"], upstream_results["reinforce loss 0.0"]
    for m, (a, b) in enumerate(zip(with_kl, without, strict=True)):
        part = slice(0, split) if m == 0 else slice(split, None)
        assert a["loss"] - b["loss"] == pytest.approx(float(kl[part].sum()), rel=1e-4)
    assert float(kl.sum()) > 1e-3


# -------------------------------------------------------------------------------------------------------------------
# TRL


@pytest.fixture(scope="module")
def trl():
    return required.importorskip(
        "trl", switch="TRL", reason="TRL (the test extra) judges the losses against its trainers"
    )


class _Accelerator:
    """One process: what _compute_loss asks of accelerate's Accelerator."""

    num_processes = 1
    sync_gradients = True
    is_main_process = True

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    gather_for_metrics = gather

    def autocast(self):
        return contextlib.nullcontext()


def trl_trainer(args, logprobs: torch.Tensor, accumulation: int = 1):
    """What GRPOTrainer.__init__ / RLOOTrainer.__init__ set from `args` and _compute_loss reads, with the model's
    per-token log-probs given: `logprobs` [B, T-1] is sliced by the rows of each call."""
    rows = {"at": 0}

    def per_token_logps(model, input_ids, attention_mask, logits_to_keep, **_kwargs):
        b = input_ids.shape[0]
        out = logprobs[rows["at"] : rows["at"] + b]
        rows["at"] += b
        return out, torch.zeros_like(out), None

    return types.SimpleNamespace(
        args=args,
        loss_type=getattr(args, "loss_type", None),
        epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        beta=args.beta,
        importance_sampling_level=getattr(args, "importance_sampling_level", "token"),
        off_policy_mask_threshold=getattr(args, "off_policy_mask_threshold", None),
        top_entropy_quantile=getattr(args, "top_entropy_quantile", 1.0),
        use_vllm=args.use_vllm,
        vllm_importance_sampling_correction=getattr(args, "vllm_importance_sampling_correction", False),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        current_gradient_accumulation_steps=accumulation,
        model=types.SimpleNamespace(training=True),
        accelerator=_Accelerator(),
        _metrics=defaultdict(lambda: defaultdict(list)),
        _get_per_token_logps_and_entropies=per_token_logps,
    )


def trl_inputs(rows: dict, part: slice, completion_mask: torch.Tensor, **extra) -> dict:
    b = len(rows["rewards"][part])
    return {
        "prompt_ids": torch.zeros(b, 1, dtype=torch.long),
        "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.zeros(b, WIDTH - 1, dtype=torch.long),
        "completion_mask": completion_mask[part],
        **extra,
    }


def grpo_config(trl, **kwargs):
    base = {"output_dir": "unused", "report_to": "none", "use_cpu": True, "bf16": False}
    return trl.GRPOConfig(**(base | kwargs))


def trl_grpo_loss(trl, rows, advantages, completion_mask, split, config, old=None):
    """GRPOTrainer._compute_loss over the micro-batches, with num_items_in_batch the generation batch's loss tokens
    (as _generate_and_score_completions sets it); grad: d (sum of the micro-batch losses) / d logprobs."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    logprobs = rows["logprobs"].clone().requires_grad_(True)
    parts = [slice(0, split), slice(split, None)] if split else [slice(0, None)]
    trainer = trl_trainer(config, logprobs, accumulation=len(parts))
    old = rows["old"] if old is None else old
    losses = []
    for part in parts:
        inputs = trl_inputs(
            rows,
            part,
            completion_mask,
            advantages=advantages[part],
            old_per_token_logps=old[part],
            ref_per_token_logps=rows["reference"][part],
            num_items_in_batch=completion_mask.sum(),
        )
        loss = GRPOTrainer._compute_loss(trainer, None, inputs)
        loss.backward()
        losses.append(loss.item())
    return losses, logprobs.grad


def test_grpo_loss_equals_trls_dapo_loss(trl):
    """GRPOTrainer, loss_type="dapo" (sum over the generation batch's loss tokens / their count, whatever the
    micro-batch), epsilon 0.2, epsilon_high 0.28, beta 0.05 (k3 in the loss), token-level ratios,
    mask_truncated_completions (rl/rlhf's overlong_filtering: the completion mask of an unended sample is zero),
    use_bias_correction_kl off: rlsteps's loss values micro-batch by micro-batch; rlsteps's gradient carries the
    k3 score-function term (as NeMo-RL's) that TRL's uncorrected KL lacks, exactly beta * k3_t / N per token."""
    r, ended = ROWS, ROWS["ended"]
    adv = group_advantages(r["rewards"], r["group"], ended, leave_one_out=False, normalize_std=True)
    split = len(ended) // 3
    config = grpo_config(
        trl,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.05,
        gradient_accumulation_steps=2,
        mask_truncated_completions=True,
        use_bias_correction_kl=False,
    )
    assert config.steps_per_generation == 2
    completion_mask = r["mask"] * ended.float()[:, None]
    theirs, their_grad = trl_grpo_loss(trl, r, adv, completion_mask, split, config)
    ours, grad = _rlsteps_grpo_loss(r, adv, ended.float(), split, beta=0.05)
    assert close(ours, theirs)
    score_term = 0.05 * k3_kl(r["logprobs"], r["reference"]) * completion_mask / completion_mask.sum()
    assert close(grad - their_grad, score_term, abs=1e-7)


def test_trls_default_kl_bias_correction_equals_rlsteps_on_policy(trl):
    """TRL's default use_bias_correction_kl multiplies k3 by the ratio exp(logp - logp_old); on-policy (logp_old =
    logp) that is 1 in value and the same beta * k3_t / N gradient term NeMo-RL's loss and rlsteps's have: values
    and gradients equal."""
    r, ended = ROWS, ROWS["ended"]
    adv = group_advantages(r["rewards"], r["group"], ended, leave_one_out=False, normalize_std=True)
    config = grpo_config(trl, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.05)
    assert config.use_bias_correction_kl
    completion_mask = r["mask"] * ended.float()[:, None]
    on_policy = dict(r, old=r["logprobs"])
    theirs, their_grad = trl_grpo_loss(trl, on_policy, adv, completion_mask, 0, config)
    ours, grad = _rlsteps_grpo_loss(on_policy, adv, ended.float(), len(ended), beta=0.05)
    assert sum(ours) == pytest.approx(theirs[0], rel=1e-5)
    assert close(grad, their_grad, abs=1e-7)


def test_trls_per_sequence_grpo_normalisation_differs_from_rlsteps_token_level_one(trl):
    """TRL's default loss_type="grpo" takes each sequence's token mean, then the mean over sequences; "bnpo" divides
    each micro-batch by its own token count. rlsteps (as NeMo-RL's token_level_loss) divides every token by the
    global batch's token count, so a long response weighs no less per token than a short one and micro-batching
    changes nothing. Pinned: TRL's "grpo" loss is the mean over rows of rlsteps's loss on the row alone (its own
    tokens as normaliser), and rlsteps's "bnpo" micro-batch loss is rlsteps's with the micro-batch's token count; the
    two normalisations differ on these rows and agree when every row has the same number of loss tokens."""
    r, ended = ROWS, ROWS["ended"]
    every = torch.ones_like(ended)
    adv = group_advantages(r["rewards"], r["group"], every, leave_one_out=False, normalize_std=True)
    mask = r["mask"]
    theirs, _ = trl_grpo_loss(trl, r, adv, mask, 0, grpo_config(trl, loss_type="grpo", beta=0.0, epsilon_high=0.28))
    per_row = [
        clipped_policy_loss(r["logprobs"][i : i + 1], r["old"][i : i + 1], adv[i : i + 1], mask[i : i + 1],
                            float(mask[i].sum()), eps_low=0.2, eps_high=0.28)[0].item()
        for i in range(len(adv))
    ]  # fmt: skip
    assert theirs[0] == pytest.approx(sum(per_row) / len(per_row), rel=1e-5)
    ours = clipped_policy_loss(r["logprobs"], r["old"], adv, mask, float(mask.sum()), eps_low=0.2, eps_high=0.28)[0]
    assert abs(ours.item() - theirs[0]) > 1e-3

    split = len(adv) // 3
    bnpo, _ = trl_grpo_loss(
        trl, r, adv, mask, split, grpo_config(trl, loss_type="bnpo", beta=0.0, gradient_accumulation_steps=2)
    )
    for got, part in zip(bnpo, (slice(0, split), slice(split, None)), strict=True):
        own = clipped_policy_loss(
            r["logprobs"][part], r["old"][part], adv[part], mask[part], float(mask[part].sum()), eps_low=0.2
        )[0]
        assert got * 2 == pytest.approx(own.item(), rel=1e-5)  # TRL divides by the accumulation steps too

    same = torch.zeros_like(mask)
    same[:, 2:7] = 1.0  # five loss tokens on every row: the normalisations agree
    theirs, _ = trl_grpo_loss(trl, r, adv, same, 0, grpo_config(trl, loss_type="grpo", beta=0.0, epsilon_high=0.28))
    ours = clipped_policy_loss(r["logprobs"], r["old"], adv, same, float(same.sum()), eps_low=0.2, eps_high=0.28)[0]
    assert theirs[0] == pytest.approx(ours.item(), rel=1e-5)


def test_reinforce_loss_gradient_is_trls_rloo_loss_gradient_times_rows_over_tokens(trl):
    """RLOOTrainer, on-policy (num_iterations 1: old_logps is the sequence log-prob itself, so its sequence-level
    clip does not bind), beta 0 (rlsteps's KL is already in the reward it is given), the completion mask of an
    unended sample zero (mask_truncated_completions, rlsteps's rows that count). TRL's loss is the mean over
    sequences of -ratio * A, where ratio = exp(sum_t logp - old); rlsteps's is the sum over tokens of -A * logp
    divided by the global token count. Same direction, per sequence the same weight on every token: rlsteps's
    gradient is TRL's times B / N (rows over loss tokens), exactly. The values differ (TRL's is -mean A)."""
    from trl.trainer.rloo_trainer import RLOOTrainer

    r, ended = ROWS, ROWS["ended"]
    adv = r["rewards"] - rloo_baseline(r["rewards"], r["group"], ended)
    mask = r["mask"] * ended.float()[:, None]
    config = trl.RLOOConfig(
        output_dir="unused", report_to="none", use_cpu=True, bf16=False, beta=0.0, mask_truncated_completions=True
    )
    assert config.num_iterations == 1
    logprobs = r["logprobs"].clone().requires_grad_(True)
    trainer = trl_trainer(config, logprobs)
    inputs = trl_inputs(r, slice(0, None), mask, advantages=adv, old_logps=(r["logprobs"] * mask).sum(1))
    theirs = RLOOTrainer._compute_loss(trainer, None, inputs)
    theirs.backward()
    their_grad = logprobs.grad

    logprobs = r["logprobs"].clone().requires_grad_(True)
    ours, _ = reinforce_loss(logprobs, adv, mask, float(mask.sum()))
    ours.backward()
    rows, tokens = len(adv), float(mask.sum())
    assert close(logprobs.grad * tokens, their_grad * rows, abs=1e-6)
    assert theirs.item() == pytest.approx(-adv.mean().item(), rel=1e-5)
    assert abs(ours.item() - theirs.item()) > 1e-3
