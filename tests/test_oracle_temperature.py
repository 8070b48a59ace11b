"""GRPO's loss at a sampling temperature other than 1, from a policy's weights to its gradient, against NeMo-RL's and
TRL's own code (tests/test_oracle_maths.py holds the same losses at temperature 1, and the sampled distribution's
log-probs alone at five settings).

A small causal LM (one Llama layer, its head scaled so that the temperature changes the distribution) scores the same
rows three ways, each on its own copy of the weights, over two micro-batches divided by the global batch's tokens:

- rlsteps: token_logprobs under SampledDistribution(T) (the chunked head, hidden states / T), clipped_policy_loss.
- NeMo-RL v0.7.0: the model's logits through its DTensor worker's path (apply_temperature_scaling, then the
  LossPostProcessor's prepare_loss_input with TrainingSamplingParams, and ClippedPGLossFn), its gradient with respect
  to the logits carried back through the model by autograd.
- TRL: GRPOTrainer's own _get_per_token_logps_and_entropies on the model with its fused head added at the config's
  temperature (as GRPOTrainer.__init__ adds it), and _compute_loss (loss_type "dapo").

The loss values and every parameter's gradient agree to float tolerance; the reference sits up to 30 nats from the
policy on some tokens, so NeMo-RL's KL clamps bind at T != 1 too.
"""

import copy

import pytest
import torch

from rlsteps.engine.algorithms.grpo import clipped_policy_loss
from rlsteps.engine.policy.logprobs import token_logprobs
from rlsteps.engine.policy.sampled_distribution import SampledDistribution
from test_oracle_maths import as_list, close, grpo_config, nemo_rl, trl_trainer

pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")

TEMPERATURES = (0.7, 1.3)
ROWS, PROMPT, COMPLETION, VOCAB = 12, 3, 8, 48
WIDTH = PROMPT + COMPLETION
SPLIT = 5  # the first micro-batch's rows
EPS_LOW, EPS_HIGH, BETA = 0.2, 0.28, 0.05
# |log r| of 30, 25 and 21 (past the input clamp), 3 and -12 (k3 past the output clamp) and 0.5, on every row's first
# completion tokens
FAR = torch.tensor([30.0, -30.0, 25.0, -21.0, 3.0, -12.0, 0.5])


def tiny_policy() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(60.0)  # logits a few nats apart: the temperature matters
    return model


POLICY = tiny_policy()


def rows(temperature: float) -> dict:
    """Tokens [B, T], a prompt of PROMPT tokens then COMPLETION right-padded ones; the response mask [B, T-1]; the
    old and reference log-probs around the policy's own at this temperature (ratios 0.55-1.8, so both clips bind)."""
    g = torch.Generator().manual_seed(int(temperature * 10))
    tokens = torch.randint(0, VOCAB, (ROWS, WIDTH), generator=g)
    lengths = torch.randint(2, COMPLETION + 1, (ROWS,), generator=g)
    completion = (torch.arange(COMPLETION)[None, :] < lengths[:, None]).float()  # [B, C]
    attention = torch.cat([torch.ones(ROWS, PROMPT), completion], dim=1).long()
    response = torch.zeros(ROWS, WIDTH - 1)
    response[:, PROMPT - 1 :] = completion  # entry t predicts token t + 1
    with torch.no_grad():
        own = token_logprobs(
            POLICY, tokens, attention, positions=response, distribution=SampledDistribution(temperature)
        )
    reference = own + (torch.rand(ROWS, WIDTH - 1, generator=g) - 0.5) * 2.0
    reference[:, PROMPT - 1 : PROMPT - 1 + len(FAR)] = own[:, PROMPT - 1 : PROMPT - 1 + len(FAR)] + FAR
    return {
        "tokens": tokens,
        "attention": attention,
        "completion": completion,
        "response": response,
        "advantages": torch.randn(ROWS, generator=g),
        "old": own + (torch.rand(ROWS, WIDTH - 1, generator=g) - 0.5) * 1.2,
        "reference": reference,
    }


PARTS = (slice(0, SPLIT), slice(SPLIT, None))


def rlsteps_loss(r: dict, temperature: float, beta: float) -> tuple[list[float], list[torch.Tensor]]:
    """rlsteps's training path: the policy's log-probs under the sampled distribution, the clipped loss."""
    model = copy.deepcopy(POLICY)
    normaliser = float(r["response"].sum())
    losses = []
    for part in PARTS:
        logprobs = token_logprobs(
            model, r["tokens"][part], r["attention"][part], positions=r["response"][part],
            distribution=SampledDistribution(temperature),
        )  # fmt: skip
        loss, _ = clipped_policy_loss(
            logprobs, r["old"][part], r["advantages"][part], r["response"][part], normaliser,
            eps_low=EPS_LOW, eps_high=EPS_HIGH, ref_logprobs=r["reference"][part], kl_beta=beta,
        )  # fmt: skip
        loss.backward()
        losses.append(loss.item())
    return losses, [p.grad.clone() for p in model.parameters()]


def logits_of(model: torch.nn.Module, r: dict, part: slice) -> torch.Tensor:
    return model(input_ids=r["tokens"][part], attention_mask=r["attention"][part], use_cache=False).logits


def nemo_rl_call(
    r: dict, temperature: float, beta: float, top_k: int = 0, top_p: float = 1.0, policy: torch.nn.Module | None = None
) -> dict:
    """NeMo-RL's loss from the policy's logits on rows `r` (its DTensor worker's path, tests/nemo_rl_maths_check.py),
    sampling filtered by top_k and top_p where given."""
    policy = POLICY if policy is None else policy
    with torch.no_grad():
        micro = [
            {
                "logits": as_list(logits_of(policy, r, part)),
                "input_ids": r["tokens"][part].tolist(),
                "prev": as_list(r["old"][part]),
                "reference": as_list(r["reference"][part]),
                "token_mask": as_list(r["response"][part]),
                "advantages": as_list(r["advantages"][part]),
                "sample_mask": [1.0] * len(r["tokens"][part]),
            }
            for part in PARTS
        ]
    config = {"ratio_clip_min": EPS_LOW, "ratio_clip_max": EPS_HIGH, "token_level_loss": True,
              "reference_policy_kl_penalty": beta}  # fmt: skip
    return {"fn": "loss_from_logits", "config": config, "micro_batches": micro, "t": temperature, "top_k": top_k,
            "top_p": top_p, "global_valid_seqs": float(ROWS),
            "global_valid_toks": float(r["response"].sum())}  # fmt: skip


CASES = [(t, beta) for t in TEMPERATURES for beta in (0.0, BETA)]


@pytest.fixture(scope="module")
def upstream_results() -> dict:
    calls = {case: nemo_rl_call(rows(case[0]), *case) for case in CASES}
    return dict(zip(calls, nemo_rl(list(calls.values())), strict=True))


def through_the_model(micro_results: list[dict], r: dict, policy: torch.nn.Module | None = None) -> list[torch.Tensor]:
    """NeMo-RL's d loss / d logits, per micro-batch, carried back through the policy's weights."""
    model = copy.deepcopy(POLICY if policy is None else policy)
    for part, result in zip(PARTS, micro_results, strict=True):
        logits_of(model, r, part).backward(torch.tensor(result["grad"]))
    return [p.grad.clone() for p in model.parameters()]


def same_gradients(ours: list[torch.Tensor], theirs: list[torch.Tensor], abs: float = 1e-6) -> bool:
    return all(close(a, b, rel=1e-4, abs=abs) for a, b in zip(ours, theirs, strict=True))


@pytest.mark.parametrize("temperature,beta", CASES, ids=lambda v: str(v))
def test_the_loss_and_its_gradient_at_the_temperature_equal_nemo_rls(upstream_results, temperature, beta):
    """ClippedPGLossFn on the logits NeMo-RL's worker divides by the temperature, with and without its k3 KL (the
    reference up to 30 nats away): the loss of each micro-batch and every weight's gradient are rlsteps's. Scoring
    the same rows at temperature 1, as training did before, moves both (asserted: the rows are not blind to it)."""
    r = rows(temperature)
    theirs = upstream_results[(temperature, beta)]
    losses, grads = rlsteps_loss(r, temperature, beta)
    assert close(losses, [m["loss"] for m in theirs], rel=1e-5, abs=1e-6)
    assert same_gradients(grads, through_the_model(theirs, r))
    raw_losses, raw_grads = rlsteps_loss(r, 1.0, beta)
    assert not close(raw_losses, losses, rel=1e-3) and not same_gradients(raw_grads, grads, abs=1e-4)


@pytest.fixture(scope="module")
def trl():
    import required

    return required.importorskip(
        "trl", switch="TRL", reason="TRL (the test extra) judges the losses against its trainers"
    )


def trl_loss(trl, r: dict, temperature: float) -> tuple[list[float], list[torch.Tensor]]:
    """GRPOTrainer's own log-probs (its fused head at the config's temperature) and _compute_loss, loss_type "dapo"
    over the generation batch's loss tokens, micro-batch by micro-batch; no KL (TRL's is the ratio-corrected one)."""
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    config = grpo_config(
        trl, loss_type="dapo", epsilon=EPS_LOW, epsilon_high=EPS_HIGH, beta=0.0, temperature=temperature,
        gradient_accumulation_steps=len(PARTS),
    )  # fmt: skip
    model = copy.deepcopy(POLICY)
    add_fused_lm_head(model, temperature=config.temperature, outputs=("log_probs", "entropy"))
    trainer = trl_trainer(config, None, accumulation=len(PARTS))
    trainer._get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies.__get__(trainer)
    losses = []
    for part in PARTS:
        inputs = {
            "prompt_ids": r["tokens"][part, :PROMPT],
            "prompt_mask": r["attention"][part, :PROMPT],
            "completion_ids": r["tokens"][part, PROMPT:],
            "completion_mask": r["completion"][part],
            "advantages": r["advantages"][part],
            "old_per_token_logps": r["old"][part, PROMPT - 1 :],
            "num_items_in_batch": r["completion"].sum(),
        }
        loss = GRPOTrainer._compute_loss(trainer, model, inputs)
        loss.backward()
        losses.append(loss.item())
    return losses, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_the_loss_and_its_gradient_at_the_temperature_equal_trls(trl, temperature):
    """TRL divides the logits by GRPOConfig.temperature in the fused head its trainer adds to the policy: its loss
    (dapo, eps 0.2/0.28, no KL) and every weight's gradient equal rlsteps's at the same temperature."""
    r = rows(temperature)
    theirs, their_grads = trl_loss(trl, r, temperature)
    ours, grads = rlsteps_loss(r, temperature, beta=0.0)
    assert close(ours, theirs, rel=1e-5, abs=1e-6)
    assert same_gradients(grads, their_grads)
