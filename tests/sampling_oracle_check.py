"""Top-k, top-p and temperature as vLLM applies them, and as the built-in sampler does: run in the vLLM environment
by test_sampling_oracle.py.

    .venv-vllm/bin/python tests/sampling_oracle_check.py POLICY_DIR SAMPLES   # prints one JSON object

For each prompt and sampling setting of SETTINGS, the next token's distribution four ways:

- vllm_probs: the distribution vLLM samples from, exactly: a vLLM engine started with logprobs_mode
  "processed_logprobs" returns the log-probs of the whole vocabulary after its temperature, top-k and top-p;
- vllm_counts: SAMPLES one-token rollouts of rlsteps' vLLM backend (VllmBackend.generate, seeds 0 .. SAMPLES-1);
- builtin_counts: the same from the built-in sampler (BuiltinBackend.generate);
- builtin_probs: the distribution the built-in sampler draws from, to within 2**-GRID_BITS per token: its sampling
  function (sample_next_token, inverse-CDF) at the midpoints of 2**GRID_BITS equal slices of (0, 1);

and raw_logits, the policy's next-token logits (the trainer's forward pass), from which the test builds the
distributions a wrong implementation would sample. The test asserts on these; this script only takes them.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch

from rlsteps.contract.config import VllmConfig
from rlsteps.engine.generation.backend import SamplingParams, eos_token_ids
from rlsteps.engine.generation.builtin import BuiltinBackend
from rlsteps.engine.generation.sampling import sample_next_token
from rlsteps.engine.generation.vllm_backend import VllmBackend
from rlsteps.engine.policy.model import load_policy

# A chat prompt and the start of a response: the next token is one of some thirty adjectives of similar probability,
# so every filter and its boundary matter. The second prompt's first token is nearly two-way (0.62, 0.38).
PROMPTS = [("Describe the cat.", "The cat is"), ("What do you think of the lake?", "")]
SETTINGS = {
    "top_k": dict(temperature=1.0, top_k=7),
    "top_p": dict(temperature=1.0, top_p=0.3),
    "top_k_top_p_t0.6": dict(temperature=0.6, top_k=12, top_p=0.5),
    "top_p_t1.7": dict(temperature=1.7, top_p=0.7),
}
GRID_BITS = 16
MAX_MODEL_LEN = 64


def prompt_ids(tokenizer, question: str, response_start: str) -> list[int]:
    chat = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) + response_start
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def builtin_grid_probs(logits: torch.Tensor, params: SamplingParams) -> list[float]:
    """The built-in sampler's distribution for one row of logits [V]: the share of the uniform numbers (the
    midpoints of 2**GRID_BITS equal slices) for which sample_next_token draws each token."""
    slices = 2**GRID_BITS
    counts = torch.zeros(logits.shape[-1], dtype=torch.long)
    for start in range(0, slices, 4096):
        uniforms = (torch.arange(start, start + 4096, dtype=torch.float64) + 0.5) / slices
        tokens = sample_next_token(logits.expand(len(uniforms), -1).contiguous(), params, uniforms)
        counts += torch.bincount(tokens, minlength=logits.shape[-1])
    return (counts.double() / slices).tolist()


def counts_of(response_ids: list[list[int]]) -> dict[int, int]:
    return dict(Counter(ids[0] for ids in response_ids))


def vllm_processed_probs(policy: Path, requests: list[tuple[list[int], SamplingParams]]) -> tuple[list, dict]:
    """vLLM's own filtered distribution of the first response token, per request: an engine that returns the
    processed log-probs of the whole vocabulary (-inf where a filter dropped the token). Its engine core runs in
    this process, as rlsteps' vLLM backend runs its own: the same numbers, and 15 of 41 s less than a second process
    importing vLLM again."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=str(policy), dtype="float32", max_model_len=MAX_MODEL_LEN, seed=0, enforce_eager=True,
        logprobs_mode="processed_logprobs", max_logprobs=-1,
    )  # fmt: skip
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in requests]
    sampling = [
        VllmSamplingParams(
            max_tokens=1,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            seed=0,
            logprobs=-1,
            detokenize=False,
        )
        for _, p in requests
    ]
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    probs = []
    for output in outputs:
        step = output.outputs[0].logprobs[0]
        row = torch.full((vocab,), -torch.inf, dtype=torch.float64)
        for token, logprob in step.items():
            row[token] = logprob.logprob
        probs.append(row.exp().tolist())
    sampler = llm.llm_engine.model_executor.driver_worker.worker.model_runner.sampler
    meta = {"vllm_sampler": type(sampler).__name__, "topk_topp_forward": sampler.topk_topp_sampler.forward.__name__}
    return probs, meta


def main() -> None:
    torch.set_num_threads(1)
    policy, samples = Path(sys.argv[1]), int(sys.argv[2])
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    model, tokenizer = load_policy(policy)
    model.eval()
    requests = []
    for question, start in PROMPTS:
        ids = prompt_ids(tokenizer, question, start)
        for name, setting in SETTINGS.items():
            requests.append((f"{question} | {start} | {name}", ids, SamplingParams(max_new_tokens=1, **setting)))

    backend = VllmBackend(
        policy, VllmConfig(kv_cache_gb=1, enforce_eager=True), max_model_len=MAX_MODEL_LEN, dtype=torch.float32,
        device=torch.device("cpu"), eos_token_ids=eos_token_ids(model, tokenizer), seed=0,
    )  # fmt: skip
    builtin = BuiltinBackend(tokenizer, batch_size=512)
    seeds = list(range(samples))
    report: dict = {"cases": {}}
    for key, ids, params in requests:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        report["cases"][key] = {
            "params": {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p},
            "raw_logits": logits.tolist(),
            "builtin_probs": builtin_grid_probs(logits, params),
            "builtin_counts": counts_of(builtin.generate(model, [ids] * samples, params, seeds).response_ids),
            "vllm_counts": counts_of(backend.generate(model, [ids] * samples, params, seeds).response_ids),
        }
    backend.close()
    del backend

    probs, meta = vllm_processed_probs(policy, [(ids, params) for _, ids, params in requests])
    for (key, _, _), row in zip(requests, probs):
        report["cases"][key]["vllm_probs"] = row
    import vllm
    from vllm.triton_utils import HAS_TRITON

    report["meta"] = {**meta, "vllm_version": vllm.__version__, "has_triton": HAS_TRITON, "samples": samples}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
