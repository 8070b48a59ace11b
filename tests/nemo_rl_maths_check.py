"""NeMo-RL's own GRPO and RLOO maths on given rows (run in a process of its own: the stand-ins of tests/upstream.py stay
in sys.modules).

    python nemo_rl_maths_check.py < CALLS.json > RESULTS.json

CALLS: a list of {"fn": NAME, ...}; RESULTS: one entry per call, in order. Every tensor is float32, as lists.

- baseline: nemo_rl.algorithms.utils.calculate_baseline_and_std_per_prompt(prompts [B, 1], rewards, valid_mask,
  leave_one_out_baseline) -> {"baseline": [B], "std": [B]}
- advantages: nemo_rl.algorithms.advantage_estimator.GRPOAdvantageEstimator({use_leave_one_out_baseline,
  normalize_rewards}).compute_advantage(prompts [B, 1], rewards, mask [B, 1]) -> [B] (what grpo_train gives it: every
  sample counts in the baseline; loss_multiplier, not the baseline, drops a truncated sample)
- kl: nemo_rl.algorithms.utils.calculate_kl(logprobs, reference, "k3") with its default clamps -> [B, S]
- sampled: the log-probs of given targets under NeMo-RL's training sampling parameters (apply_temperature_scaling,
  logits_sampling_utils.apply_top_k_top_p, log_softmax) and the gradient of their weighted sum w.r.t. the logits
- loss: nemo_rl.algorithms.loss.loss_functions.ClippedPGLossFn(ClippedPGLossConfig(**config)) called once per
  micro-batch with the global valid sequence and token counts, as NeMo-RL's policy worker calls it ->
  [{"loss": float, "grad": [b, S]}] (grad: d loss / d next_token_logprobs). A micro-batch gives next-token tensors
  [b, S] (logprobs, prev, generation, reference, token_mask) and advantages [b]; NeMo-RL's data dict holds them
  at [b, S + 1] (position 0 is the first prompt token, which predicts nothing), so a zero column is put in front.
- loss_from_logits: the same loss from a micro-batch's logits [b, S + 1, V] and input_ids [b, S + 1], as NeMo-RL's
  DTensor worker computes it: apply_temperature_scaling (its forward's), then the LossPostProcessor's
  prepare_loss_input with the TrainingSamplingParams (top-k/top-p, log_softmax, the targets gathered) and
  ClippedPGLossFn -> [{"loss": float, "grad": [b, S + 1, V]}] (grad: d loss / d logits). Under top-k/top-p its
  non-parallel path hands apply_top_k_top_p the slice logits[:, :-1], which that function's view() refuses for more
  than one row (contiguous only at one row a micro-batch): the slice is made contiguous first (contiguous_filter_input).
- dynamic_sampling: nemo_rl.algorithms.grpo.dynamic_sampling called as grpo_train calls it, once per generation
  batch ({"ids": [B], "std": [B]} each: a row id and its group's reward std) with the batch cache and the count of
  generation batches, until a batch is complete -> {"ids": the row ids that train, "batches": generation batches,
  "discarded": dynamic_sampling_num_discarded_valid_samples} or, past dynamic_sampling_max_gen_batches,
  {"error": ValueError's message, "batches": ...}
"""

import contextlib
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import upstream  # noqa: E402


@contextlib.contextmanager
def contiguous_filter_input(model_utils):
    """nemo_rl.distributed.model_utils.apply_top_k_top_p given a contiguous copy of its logits (the same values and
    gradient), as its view() needs."""
    original = model_utils.apply_top_k_top_p
    model_utils.apply_top_k_top_p = lambda logits, **kwargs: original(logits.contiguous(), **kwargs)
    try:
        yield
    finally:
        model_utils.apply_top_k_top_p = original


@contextlib.contextmanager
def on_the_cpu(torch):
    """Tensor.cuda() answered with the tensor itself, here on a CPU: the one CUDA call of NeMo-RL's non-parallel
    log-prob path (get_next_token_logprobs_from_logits)."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def main() -> int:
    calls = json.load(sys.stdin)
    with (
        contextlib.redirect_stdout(sys.stderr),
        upstream.nemo_rl_importable(stub=upstream.HEAVY - {"torch"}),
    ):
        import torch

        # nemo_rl.utils.logger imports torch.utils.tensorboard, whose import checks tensorboard's version (a stand-in)
        board = types.ModuleType("torch.utils.tensorboard")
        board.SummaryWriter = type("SummaryWriter", (), {})
        sys.modules["torch.utils.tensorboard"] = board

        from nemo_rl.algorithms.advantage_estimator import GRPOAdvantageEstimator
        from nemo_rl.algorithms.logits_sampling_utils import TrainingSamplingParams, apply_top_k_top_p
        from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
        from nemo_rl.algorithms.loss.utils import prepare_loss_input
        from nemo_rl.algorithms.utils import calculate_baseline_and_std_per_prompt, calculate_kl
        from nemo_rl.distributed import model_utils
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict
        from nemo_rl.models.automodel.train import apply_temperature_scaling

        def tensor(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32)

        def shifted(values) -> torch.Tensor:  # [b, S] next-token values -> [b, S + 1] as NeMo-RL's data holds them
            t = tensor(values)
            return torch.cat([torch.zeros_like(t[:, :1]), t], dim=1)

        def baseline(call):
            prompts = torch.tensor(call["prompts"])[:, None]
            b, s = calculate_baseline_and_std_per_prompt(
                prompts, tensor(call["rewards"]), tensor(call["valid"]), leave_one_out_baseline=call["leave_one_out"]
            )
            return {"baseline": b.tolist(), "std": s.tolist()}

        def advantages(call):
            estimator = GRPOAdvantageEstimator(
                {"use_leave_one_out_baseline": call["leave_one_out"], "normalize_rewards": call["normalize"]}, None
            )
            rewards = tensor(call["rewards"])
            prompts = torch.tensor(call["prompts"])[:, None]
            return estimator.compute_advantage(prompts, rewards, torch.ones(len(rewards), 1))[:, 0].tolist()

        def kl(call):
            return calculate_kl(tensor(call["logprobs"]), tensor(call["reference"]), kl_type="k3").tolist()

        def loss(call):
            loss_fn = ClippedPGLossFn(ClippedPGLossConfig(**call["config"]))
            out = []
            for micro in call["micro_batches"]:
                logprobs = tensor(micro["logprobs"]).requires_grad_(True)
                data = {
                    "advantages": tensor(micro["advantages"])[:, None].expand(-1, logprobs.shape[1] + 1),
                    "prev_logprobs": shifted(micro["prev"]),
                    "generation_logprobs": shifted(micro.get("generation", micro["prev"])),
                    "reference_policy_logprobs": shifted(micro.get("reference", micro["prev"])),
                    "token_mask": shifted(micro["token_mask"]),
                    "sample_mask": tensor(micro["sample_mask"]),
                }
                value, _metrics = loss_fn(
                    logprobs, data, tensor(call["global_valid_seqs"]), tensor(call["global_valid_toks"])
                )
                value.backward()
                out.append({"loss": value.item(), "grad": logprobs.grad.tolist()})
            return out

        def loss_from_logits(call):  # the DTensor worker's LossPostProcessor on one micro-batch's logits
            loss_fn = ClippedPGLossFn(ClippedPGLossConfig(**call["config"]))
            params = TrainingSamplingParams(top_k=call["top_k"] or None, top_p=call["top_p"], temperature=call["t"])
            out = []
            for micro in call["micro_batches"]:
                logits = tensor(micro["logits"]).requires_grad_(True)
                data = BatchedDataDict(
                    {
                        "input_ids": torch.tensor(micro["input_ids"]),
                        "advantages": tensor(micro["advantages"])[:, None].expand(-1, logits.shape[1]),
                        "prev_logprobs": shifted(micro["prev"]),
                        "generation_logprobs": shifted(micro["prev"]),
                        "reference_policy_logprobs": shifted(micro["reference"]),
                        "token_mask": shifted(micro["token_mask"]),
                        "sample_mask": tensor(micro["sample_mask"]),
                    }
                )
                scaled = apply_temperature_scaling(logits.clone(), params)
                with on_the_cpu(torch), contiguous_filter_input(model_utils):  # input_ids.cuda(): the targets
                    loss_input, data = prepare_loss_input(scaled, data, loss_fn, sampling_params=params)
                value, _metrics = loss_fn(
                    data=data,
                    global_valid_seqs=tensor(call["global_valid_seqs"]),
                    global_valid_toks=tensor(call["global_valid_toks"]),
                    **loss_input,
                )
                value.backward()
                out.append({"loss": value.item(), "grad": logits.grad.tolist()})
            return out

        def dynamic_sampling(call):  # grpo_train's loop around it: a cache and a count of generation batches
            from nemo_rl.algorithms.grpo import dynamic_sampling as their_dynamic_sampling

            config = types.SimpleNamespace(grpo={"use_dynamic_sampling": True, **call["grpo"]})
            timer = types.SimpleNamespace(time=lambda name: contextlib.nullcontext())
            cache = None
            for count, generated in enumerate(call["generation_batches"], start=1):
                ids = torch.tensor(generated["ids"])
                batch = BatchedDataDict({"ids": ids, "total_reward": torch.zeros(len(ids))})
                std = tensor(generated["std"])
                try:
                    batch, complete, cache, metrics = their_dynamic_sampling(
                        batch, std, torch.zeros(len(ids)), count, config, timer, cache
                    )
                except ValueError as error:
                    return {"error": str(error), "batches": count}
                if complete:
                    discarded = metrics["dynamic_sampling_num_discarded_valid_samples"]
                    return {"ids": batch["ids"].tolist(), "batches": count, "discarded": discarded}
            return {"incomplete": True, "batches": len(call["generation_batches"])}

        def sampled(call):  # as NeMo-RL's DTensor worker scores a token: temperature, then top-k/top-p, log_softmax
            params = TrainingSamplingParams(top_k=call["top_k"] or None, top_p=call["top_p"], temperature=call["t"])
            logits = tensor(call["logits"]).requires_grad_(True)
            scaled = apply_temperature_scaling(logits.clone(), params)
            filtered, _ = apply_top_k_top_p(scaled, top_k=params.top_k, top_p=params.top_p)
            targets = torch.tensor(call["targets"])[:, None]
            picked = filtered.log_softmax(-1).gather(-1, targets).squeeze(-1)
            (picked * tensor(call["weights"])).sum().backward()
            return {"logprobs": picked.tolist(), "grad": logits.grad.tolist()}

        functions = {
            "baseline": baseline,
            "advantages": advantages,
            "kl": kl,
            "loss": loss,
            "loss_from_logits": loss_from_logits,
            "sampled": sampled,
            "dynamic_sampling": dynamic_sampling,
        }
        results = [functions[call["fn"]](call) for call in calls]
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
