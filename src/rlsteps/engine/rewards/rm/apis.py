"""What each kind of reward server is sent and answers (rm.api); the client (client.py) sends, retries and checks.

- rlsteps: `rlsteps serve rm`, POST /v1/rewards with prompts, conversations or token ids -> {"rewards": [...]}.
- vllm: vLLM's pooling server (`--runner pooling` on a one-label sequence-classification model), POST /classify.
  Texts go as `input` (the prompt as the policy saw it, the response and the reward tokenizer's EOS, which the
  server's GET /tokenizer_info names), a conversation as `messages` with the response as the assistant's turn (one
  per request: vLLM renders one conversation a request with the model's chat template). Every request asks for the
  raw score (`use_activation: false`): by default vLLM passes a one-label model's score through a sigmoid.
- triton: NeMo-Aligner's reward server (serve_reward_model.py, PyTriton) over Triton's HTTP inference protocol,
  POST /v2/models/<name>/infer with the inputs its RemoteGPTRMClient sends: `tokens` (INT64 [B, L], the policy's
  prompt and response token ids, right-padded with 0) and `sequence_lengths` (INT64 [B, 1]); its output `rewards`
  is FP32 [B, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlsteps.engine.rewards.text import reward_input_text, truncate

NEMO_ALIGNER_MODEL = "reward_model"  # serve_reward_model.py's inference.model_name default
TRITON_PAD_ID = 0  # RemoteGPTRMClient pads tokens with 0; the server reads each row up to its sequence length


class InvalidAnswer(ValueError):
    """The server's answer holds no reward per input (the wrong server, or a model of the wrong kind)."""


@dataclass(frozen=True)
class Request:
    path: str
    body: dict[str, Any]
    size: int  # the rewards its answer must hold


def chunks(rows: list, size: int) -> list[list]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def finite_rewards(values: Any, expected: int) -> list[float]:
    if not isinstance(values, list):
        raise InvalidAnswer(f"rewards that are not a list: {str(values)[:200]!r}")
    if len(values) != expected:
        raise InvalidAnswer(f"{len(values)} rewards for {expected} inputs")
    bad = [r for r in values if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r)]
    if bad:
        raise InvalidAnswer(f"rewards that are not finite numbers: {bad[:5]}")
    return [float(r) for r in values]


class RlstepsAPI:
    name = "rlsteps"
    health_path = "/health"
    eos_path: str | None = None  # where the server names the EOS a text must end with, when the client adds it
    start_hint = "start one with `rlsteps serve rm --model PATH` and point rm.url at it"
    not_found_hint = "no /v1/rewards there: for vLLM's or NeMo-Aligner's reward server set rm.api=vllm or rm.api=triton"

    def __init__(self, model: str | None, max_length: int | None, truncation_side: str | None) -> None:
        options = {"max_length": max_length, "truncation_side": truncation_side}
        self.options = {k: v for k, v in options.items() if v is not None}  # the server's own where None

    def prompt_requests(self, prompts: list[str], responses: list[str], batch_size: int, eos: str | None = None):
        return self._requests(batch_size, prompts=prompts, responses=responses)

    def conversation_requests(self, conversations: list[list[dict]], responses: list[str], batch_size: int):
        return self._requests(batch_size, conversations=conversations, responses=responses)

    def token_requests(self, token_ids: list[list[int]], batch_size: int):
        return self._requests(batch_size, tokens=token_ids)

    def _requests(self, batch_size: int, **columns: list) -> list[Request]:
        parts = {name: chunks(rows, batch_size) for name, rows in columns.items()}
        return [
            Request("/v1/rewards", {**{name: part[i] for name, part in parts.items()}, **self.options}, len(rows))
            for i, rows in enumerate(next(iter(parts.values())))
        ]

    def rewards_of(self, answer: Any, expected: int) -> list[float]:
        if not isinstance(answer, dict) or "rewards" not in answer:
            raise InvalidAnswer(f'the answer has no "rewards" list: {str(answer)[:200]!r}')
        return finite_rewards(answer["rewards"], expected)


class VllmAPI:
    name = "vllm"
    health_path = "/health"
    eos_path = "/tokenizer_info"  # served with --enable-tokenizer-info-endpoint
    start_hint = "start vLLM's server on the reward model (`vllm serve PATH --runner pooling`) and point rm.url at it"
    not_found_hint = (
        "vLLM serves /classify for a sequence-classification model started with --runner pooling "
        "(and /tokenizer_info with --enable-tokenizer-info-endpoint)"
    )

    def __init__(self, model: str | None, max_length: int | None, truncation_side: str | None) -> None:
        options = {"model": model, "truncate_prompt_tokens": max_length, "truncation_side": truncation_side}
        self.options = {"use_activation": False, **{k: v for k, v in options.items() if v is not None}}

    def prompt_requests(self, prompts: list[str], responses: list[str], batch_size: int, eos: str | None = None):
        texts = [reward_input_text(p, r, eos) for p, r in zip(prompts, responses)]
        return [Request("/classify", {"input": part, **self.options}, len(part)) for part in chunks(texts, batch_size)]

    def conversation_requests(self, conversations: list[list[dict]], responses: list[str], batch_size: int):
        return [
            Request("/classify", {"messages": [*c, {"role": "assistant", "content": r}], **self.options}, 1)
            for c, r in zip(conversations, responses)
        ]

    def token_requests(self, token_ids: list[list[int]], batch_size: int):
        parts = chunks(token_ids, batch_size)
        return [Request("/classify", {"input": part, **self.options}, len(part)) for part in parts]

    def rewards_of(self, answer: Any, expected: int) -> list[float]:
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or not all(isinstance(d, dict) and "probs" in d for d in data):
            raise InvalidAnswer(f'the answer has no "data" of classifications: {str(answer)[:200]!r}')
        labels = {len(d["probs"]) for d in data if isinstance(d["probs"], list)}
        if labels != {1} and data:
            raise InvalidAnswer(
                f"the model classifies into {sorted(labels)} labels: a scalar reward model has one (num_labels=1)"
            )
        ordered = sorted(data, key=lambda d: d.get("index", 0))
        return finite_rewards([d["probs"][0] for d in ordered], expected)

    @staticmethod
    def eos_of(answer: Any) -> str:
        """The EOS text in GET /tokenizer_info's answer (a string, or an added token's {"content": ...})."""
        eos = answer.get("eos_token") if isinstance(answer, dict) else None
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if not isinstance(eos, str):
            raise InvalidAnswer(f"GET /tokenizer_info names no eos_token: {str(answer)[:200]!r}")
        return eos


class TritonAPI:
    name = "triton"
    health_path = "/v2/health/ready"
    eos_path = None
    start_hint = "start NeMo-Aligner's reward server (serve_reward_model.py) and point rm.url at it"
    not_found_hint = "no such model there: rm.model must be the server's inference.model_name (reward_model)"
    # Triton answers GET /v2 with its server metadata; any other server at the URL does not
    metadata_path = "/v2"
    not_triton_hint = (
        "no Triton server answers there (GET /v2 gives no Triton metadata): rm.api=triton speaks to NeMo-Aligner's "
        "PyTriton reward server; for `rlsteps serve rm` set rm.api=rlsteps, for vLLM's reward serving rm.api=vllm"
    )

    def explain_not_found(self, metadata: dict[str, Any] | None) -> str:
        """The hint for a 404 on the infer path, from what GET /v2 answered (None: no JSON object)."""
        is_triton = isinstance(metadata, dict) and "version" in metadata and "extensions" in metadata
        return self.not_found_hint if is_triton else self.not_triton_hint

    def __init__(self, model: str | None, max_length: int | None, truncation_side: str | None) -> None:
        self.path = f"/v2/models/{model or NEMO_ALIGNER_MODEL}/infer"
        self.max_length, self.truncation_side = max_length, truncation_side or "left"

    def prompt_requests(self, prompts, responses, batch_size, eos=None):
        raise ValueError("rm.api=triton scores token ids (NeMo-Aligner's request): call score_tokens")

    conversation_requests = prompt_requests

    def token_requests(self, token_ids: list[list[int]], batch_size: int) -> list[Request]:
        if self.max_length is not None:
            token_ids = [truncate(ids, self.max_length, self.truncation_side) for ids in token_ids]
        return [Request(self.path, self._infer_body(part), len(part)) for part in chunks(token_ids, batch_size)]

    @staticmethod
    def _infer_body(rows: list[list[int]]) -> dict[str, Any]:
        lengths = [len(ids) for ids in rows]
        width = max(lengths)
        padded = [v for ids in rows for v in [*ids, *[TRITON_PAD_ID] * (width - len(ids))]]  # row-major [B, L]
        return {
            "inputs": [
                {"name": "tokens", "shape": [len(rows), width], "datatype": "INT64", "data": padded},
                {"name": "sequence_lengths", "shape": [len(rows), 1], "datatype": "INT64", "data": lengths},
            ],
            "outputs": [{"name": "rewards"}],
        }

    def rewards_of(self, answer: Any, expected: int) -> list[float]:
        outputs = answer.get("outputs") if isinstance(answer, dict) else None
        found = [o for o in outputs or [] if isinstance(o, dict) and o.get("name") == "rewards"]
        if not found:
            raise InvalidAnswer(f'the answer has no output named "rewards": {str(answer)[:200]!r}')
        return finite_rewards(found[0].get("data"), expected)


APIS = {api.name: api for api in (RlstepsAPI, VllmAPI, TritonAPI)}
