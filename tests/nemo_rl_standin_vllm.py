"""vLLM's engine, stood in for NeMo-RL's own vLLM workers on a CPU (tests/nemo_rl_run.py).

NeMo-RL's generation workers run as they are (VllmGenerationWorkerImpl, VllmAsyncGenerationWorkerImpl: their config
handling, the engine's kwargs, prompt formatting, padding and output assembly); what they call of vLLM is replaced
here: the LLM and AsyncLLM engines, the argument classes, the metrics reader, and the async worker's OpenAI server
(NeMo-Gym's stand-in answers what it would be asked). The engine reads the model's config and tokenizer from the
model path it was given, refuses a prompt longer than max_model_len as vLLM does, answers each prompt with a few
random tokens and EOS within the sampling parameters' max_tokens, and acknowledges the weight-refit RPCs.
"""

from __future__ import annotations

import hashlib
import types
from typing import Any

import torch

import standin_ray

MAX_STANDIN_TOKENS = 24  # the stand-in engine's answers are short: the step's shapes, not its length, are the point


def seed_of(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def draw_answer(prompt_ids: list[int], max_new: int, vocab: int, eos: int, salt: Any = 0) -> tuple[list[int], bool]:
    """A short answer: random tokens then EOS; (tokens, truncated) when max_new leaves no room for the EOS."""
    generator = torch.Generator().manual_seed(seed_of(tuple(prompt_ids[-16:]), salt))
    length = int(torch.randint(1, max(2, min(max_new, MAX_STANDIN_TOKENS) + 1), (1,), generator=generator))
    body = torch.randint(0, vocab, (length,), generator=generator).tolist()
    body = [eos + 1 if t == eos else t for t in body][: max_new - 1] if max_new > 1 else body[:max_new]
    truncated = len(body) + 1 > max_new
    return (body if truncated else body + [eos]), truncated


class StandInEngine:
    """In place of vllm.LLM (and AsyncLLM): the kwargs NeMo-RL built, checked as vLLM's engine would read them."""

    def __init__(self, **llm_kwargs: Any) -> None:
        from transformers import AutoConfig, AutoTokenizer

        model = llm_kwargs["model"]
        hf_config = AutoConfig.from_pretrained(model)  # vLLM reads the model's config first; a bad path fails here
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.vocab = hf_config.vocab_size
        self.max_model_len = llm_kwargs.get("max_model_len") or hf_config.max_position_embeddings
        self.kwargs = llm_kwargs
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=self.max_model_len))
        self.calls = 0

    def generate(self, prompts: list[dict], sampling_params: Any, use_tqdm: bool = False) -> list[Any]:
        outputs = []
        self.calls += 1
        for number, prompt in enumerate(prompts):
            ids = list(prompt["prompt_token_ids"])
            if len(ids) >= self.max_model_len:  # vLLM's own refusal
                raise ValueError(
                    f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of "
                    f"{self.max_model_len}. Make sure that `max_model_len` is no smaller than the number of text "
                    "tokens."
                )
            room = min(sampling_params.max_tokens or self.max_model_len, self.max_model_len - len(ids))
            tokens, truncated = draw_answer(ids, room, self.vocab, self.tokenizer.eos_token_id, (self.calls, number))
            logprobs = [{t: types.SimpleNamespace(logprob=-1.0 - (t % 7) / 7)} for t in tokens]
            completion = types.SimpleNamespace(
                token_ids=tokens, logprobs=logprobs, finish_reason="length" if truncated else "stop"
            )
            outputs.append(types.SimpleNamespace(outputs=[completion], prompt_token_ids=ids))
        return outputs

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        answers = {"report_device_id": "GPU-standin", "update_weights_via_ipc_zmq": True,
                   "update_weights_from_collective": True}  # fmt: skip
        return [answers.get(method)]

    def sleep(self, level: int = 1) -> None:
        return None

    def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    def reset_prefix_cache(self) -> bool:
        return True


class StandInAsyncEngine(StandInEngine):
    """In place of vLLM's AsyncLLM: the same, with its awaitable RPCs and the engine-core socket NeMo-RL locks."""

    def __init__(self, **llm_kwargs: Any) -> None:
        super().__init__(**llm_kwargs)
        socket = types.SimpleNamespace(send_multipart=lambda *a, **k: None)
        self.engine_core = types.SimpleNamespace(input_socket=types.SimpleNamespace(_shadow_sock=socket))

    @classmethod
    def from_engine_args(cls, engine_args: Any, stat_loggers: Any = None) -> StandInAsyncEngine:
        return cls(**engine_args.kwargs)

    async def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        return StandInEngine.collective_rpc(self, method, args, kwargs)

    async def sleep(self, level: int = 1) -> None:
        return None

    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def reset_prefix_cache(self) -> bool:
        return True

    def shutdown(self) -> None:
        return None


class Arguments:
    """vLLM's argument and config classes (SamplingParams, AsyncEngineArgs, CompilationConfig): what NeMo-RL gave."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        vars(self).update(kwargs)

    def __getattr__(self, name: str) -> None:  # a parameter left at vLLM's default
        return None


VLLM = {  # vLLM's names NeMo-RL's workers call, with what stands in for them; the rest of vLLM stays inert
    "vllm": {"LLM": StandInEngine, "SamplingParams": Arguments},
    "vllm.engine.arg_utils": {"AsyncEngineArgs": Arguments},
    "vllm.config": {"CompilationConfig": Arguments},
    "vllm.v1.engine.async_llm": {"AsyncLLM": StandInAsyncEngine},
    "vllm.v1.metrics.reader": {"get_metrics_snapshot": lambda: []},
}


def async_generation_worker(implementation: type) -> type:
    """NeMo-RL's async vLLM worker as it is but for the OpenAI server vLLM would serve NeMo-Gym from."""

    class VllmAsyncGenerationWorker(implementation):
        def _setup_vllm_server(self):  # NeMo-Gym's stand-in answers the requests this server would get
            port = getattr(self, "_reserved_port", None) or standin_ray.free_port()
            return None, f"http://127.0.0.1:{port}/v1", None

    return VllmAsyncGenerationWorker
