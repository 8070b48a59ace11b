"""GRPO's loss with a KL penalty under top-k/top-p (and a temperature other than 1), from a policy's weights to its
gradient, against NeMo-RL's own code; and the one forward that gives both sets of log-probs.

NeMo-RL v0.7.0's DTensor worker scores the policy twice from the same logits divided by the temperature
(prepare_loss_input): through the top-k/top-p filter for the ratio (curr_logprobs) and without it for the KL
(curr_logprobs_unfiltered), whose k3 it weights by exp(unfiltered - sg(unfiltered)); the reference's log-probs are
the temperature's alone (use_reference_model). rlsteps's training path (token_logprobs with unfiltered=True, one
forward, and clipped_policy_loss's kl_logprobs) gives the same loss and every weight's gradient; reading the KL from
the filtered log-probs, as it did before, does not (asserted: the rows are not blind to it). The reference sits up to
30 nats from the policy on some tokens, so NeMo-RL's KL clamps bind too.

Every completion token is drawn by the built-in sampler from the policy's own filtered distribution, so no token
falls outside the filter (where NeMo-RL masks the token out and rlsteps keeps it: sampled_distribution.py).
"""

import copy

import pytest
import torch

from rlsteps.engine.algorithms.grpo import clipped_policy_loss
from rlsteps.engine.generation.backend import SamplingParams
from rlsteps.engine.generation.sampling import sample_next_token
from rlsteps.engine.policy.logprobs import token_logprobs
from rlsteps.engine.policy.sampled_distribution import SampledDistribution
from test_oracle_maths import close, nemo_rl
from test_oracle_temperature import (
    FAR,
    PROMPT,
    ROWS,
    SPLIT,
    VOCAB,
    WIDTH,
    same_gradients,
    through_the_model,
    tiny_policy,
)
from test_oracle_temperature import nemo_rl_call as oracle_call

pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")

SETTINGS = [(0.7, 6, 1.0), (1.3, 0, 0.6), (0.7, 8, 0.8)]  # (temperature, top_k, top_p)
EPS_LOW, EPS_HIGH, BETA = 0.2, 0.28, 0.05
PARTS = (slice(0, SPLIT), slice(SPLIT, None))


def spread_policy() -> torch.nn.Module:
    """test_oracle_temperature's policy with its head 12 times flatter: the filters leave out a mass that shows in
    the log-probs (about a nat at these settings), so reading the KL from the filtered ones moves the loss."""
    model = tiny_policy()
    with torch.no_grad():
        model.lm_head.weight.div_(12.0)
    return model


POLICY = spread_policy()


def sampled_tokens(distribution: SampledDistribution, g: torch.Generator) -> torch.Tensor:
    """[B, T]: a random prompt, then each token drawn from the policy's filtered distribution given the ones before."""
    params = SamplingParams(1, distribution.temperature, distribution.top_p, distribution.top_k)
    tokens = torch.randint(0, VOCAB, (ROWS, PROMPT), generator=g)
    with torch.no_grad():
        while tokens.shape[1] < WIDTH:
            last = POLICY(input_ids=tokens, use_cache=False).logits[:, -1].float()
            uniforms = torch.rand(ROWS, generator=g).clamp(1e-6, 1 - 1e-6)
            tokens = torch.cat([tokens, sample_next_token(last, params, uniforms)[:, None]], dim=1)
    return tokens


def rows(distribution: SampledDistribution) -> dict:
    """Sampled rows, right-padded masks, old log-probs around the filtered ones (ratios 0.55-1.8) and a reference
    around the unfiltered ones with |log r| up to 30 on every row's first completion tokens."""
    g = torch.Generator().manual_seed(distribution.top_k * 7 + int(distribution.top_p * 100))
    tokens = sampled_tokens(distribution, g)
    lengths = torch.randint(2, WIDTH - PROMPT + 1, (ROWS,), generator=g)
    completion = (torch.arange(WIDTH - PROMPT)[None, :] < lengths[:, None]).float()
    attention = torch.cat([torch.ones(ROWS, PROMPT), completion], dim=1).long()
    response = torch.zeros(ROWS, WIDTH - 1)
    response[:, PROMPT - 1 :] = completion
    with torch.no_grad():
        filtered, unfiltered = token_logprobs(
            POLICY, tokens, attention, positions=response, distribution=distribution, unfiltered=True
        )
    reference = unfiltered + (torch.rand(ROWS, WIDTH - 1, generator=g) - 0.5) * 2.0
    far = slice(PROMPT - 1, PROMPT - 1 + len(FAR))
    reference[:, far] = unfiltered[:, far] + FAR
    return {
        "tokens": tokens,
        "attention": attention,
        "response": response,
        "advantages": torch.randn(ROWS, generator=g),
        "old": filtered + (torch.rand(ROWS, WIDTH - 1, generator=g) - 0.5) * 1.2,
        "reference": reference * response,
    }


def rlsteps_loss(r: dict, distribution: SampledDistribution, kl_unfiltered: bool = True):
    """rlsteps's training path: one forward, both sets of log-probs, the clipped loss with k3 on the unfiltered ones
    (kl_unfiltered False: on the filtered ones, as before)."""
    model = copy.deepcopy(POLICY)
    normaliser = float(r["response"].sum())
    losses = []
    for part in PARTS:
        filtered, unfiltered = token_logprobs(
            model, r["tokens"][part], r["attention"][part], positions=r["response"][part],
            distribution=distribution, unfiltered=True,
        )  # fmt: skip
        loss, _ = clipped_policy_loss(
            filtered, r["old"][part], r["advantages"][part], r["response"][part], normaliser,
            eps_low=EPS_LOW, eps_high=EPS_HIGH, ref_logprobs=r["reference"][part], kl_beta=BETA,
            kl_logprobs=unfiltered if kl_unfiltered else None,
        )  # fmt: skip
        loss.backward()
        losses.append(loss.item())
    return losses, [p.grad.clone() for p in model.parameters()]


def nemo_rl_call(r: dict, distribution: SampledDistribution) -> dict:
    d = distribution
    return oracle_call(r, d.temperature, BETA, top_k=d.top_k, top_p=d.top_p, policy=POLICY)


@pytest.fixture(scope="module")
def upstream_results() -> dict:
    calls = {s: nemo_rl_call(rows(SampledDistribution(*s)), SampledDistribution(*s)) for s in SETTINGS}
    return dict(zip(calls, nemo_rl(list(calls.values())), strict=True))


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"T{s[0]}-k{s[1]}-p{s[2]}")
def test_the_kl_under_top_k_and_top_p_reads_the_unfiltered_logprobs_as_nemo_rls(upstream_results, settings):
    """ClippedPGLossFn on NeMo-RL's DTensor path with TrainingSamplingParams and a KL penalty of 0.05: the ratio from
    the filtered log-probs, k3 from the unfiltered ones against the temperature's reference. Each micro-batch's loss
    and every weight's gradient are rlsteps's; the KL read from the filtered log-probs moves both."""
    distribution = SampledDistribution(*settings)
    r = rows(distribution)
    theirs = upstream_results[settings]
    losses, grads = rlsteps_loss(r, distribution)
    assert close(losses, [m["loss"] for m in theirs], rel=1e-5, abs=1e-6)
    assert same_gradients(grads, through_the_model(theirs, r, POLICY))
    filtered_losses, filtered_grads = rlsteps_loss(r, distribution, kl_unfiltered=False)
    assert not close(filtered_losses, losses, rel=1e-3) and not same_gradients(filtered_grads, grads, abs=1e-4)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("full_logits", [False, True], ids=["chunked-head", "full-logits"])
def test_one_forward_gives_the_filtered_and_the_unfiltered_logprobs_of_two(packed, full_logits):
    """token_logprobs (and packed_token_logprobs) with unfiltered=True: [2, B, T-1], the filtered distribution's and
    the temperature's alone, equal in value and gradient to two passes, one under each distribution, on the chunked
    head and on the full logits (a head with a bias)."""
    from rlsteps.engine.batch import RolloutBatch
    from rlsteps.engine.policy.logprobs import packed_token_logprobs

    distribution = SampledDistribution(0.7, 8, 0.8)
    r = rows(distribution)
    batch = RolloutBatch(
        tokens=r["tokens"] * r["attention"], prompt_lengths=torch.full((ROWS,), PROMPT),
        response_lengths=r["attention"].sum(1) - PROMPT, is_end=torch.ones(ROWS, dtype=torch.bool),
        prompt_ids=[str(i) for i in range(ROWS)], prompt_texts=[""] * ROWS, response_texts=[""] * ROWS, pad_id=0,
    )  # fmt: skip
    weights = torch.randn(2, ROWS, WIDTH - 1, generator=torch.Generator().manual_seed(1))

    def score(model: torch.nn.Module, under: SampledDistribution, unfiltered: bool = False) -> torch.Tensor:
        if packed:
            return packed_token_logprobs(model, batch, WIDTH * 3, distribution=under, unfiltered=unfiltered)
        mask, wanted = batch.attention_mask(), batch.response_mask()
        return token_logprobs(model, batch.tokens, mask, wanted, distribution=under, unfiltered=unfiltered)

    def scored(sets: tuple[SampledDistribution, ...] | None):
        """One forward's two sets (sets None), or a forward of its own under each of `sets`."""
        model = copy.deepcopy(POLICY)
        if full_logits:
            model.lm_head.bias = torch.nn.Parameter(torch.zeros(VOCAB))
        both = score(model, distribution, True) if sets is None else torch.stack([score(model, d) for d in sets])
        (both * weights).sum().backward()
        return both.detach(), [p.grad.clone() for p in model.parameters()]

    one_forward, one_grads = scored(None)
    two_forwards, two_grads = scored((distribution, distribution.without_filters()))
    assert one_forward.shape == (2, ROWS, WIDTH - 1)
    assert torch.allclose(one_forward, two_forwards, atol=1e-6)
    assert same_gradients(one_grads, two_grads)
    assert (one_forward[0] - one_forward[1]).abs().max() > 0.05  # the filter moves the log-probs
