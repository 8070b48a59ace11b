"""The reward terms of a config (`rewards:`) and the sections of their served sources: the reward model's client and
the server a run starts for itself, the judge's client. Shared by the recipes' schemas (contract.config) and
eval/policy's (contract.eval_config). Torch-free."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from rlsteps.contract.config_types import NonNegativeFloat, PositiveFloat, Probability, Section


class RewardServerConfig(Section):
    """The reward server a run starts for itself (no rm.url): where its model runs and how it batches."""

    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: the GPU when there is one
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: the dtype the checkpoint stores
    max_batch: PositiveInt = 64
    max_wait_ms: NonNegativeFloat = 5


class RewardModelClientConfig(Section):
    url: str | None = None
    # the server's protocol: rlsteps (`rlsteps serve rm`, POST /v1/rewards), vllm (vLLM's pooling server, POST
    # /classify, raw scores) or triton (NeMo-Aligner's PyTriton reward server: the policy's token ids over Triton's
    # inference protocol)
    api: Literal["rlsteps", "vllm", "triton"] = "rlsteps"
    model: str | None = None  # the served model's name: vLLM's (None: the one it serves); Triton's (reward_model)
    token: str | None = None
    timeout_s: PositiveFloat = 60
    max_retries: NonNegativeInt = 5
    backoff_s: NonNegativeFloat = 1.0
    batch_size: PositiveInt = 64
    concurrency: PositiveInt = 4
    max_length: PositiveInt | None = None  # tokens the reward model reads per pair; None: the server's --max-length
    truncation_side: Literal["left", "right"] = "left"  # left keeps the end of a longer pair: the response
    # policy: the prompt as the policy saw it (its chat template) + response + EOS; reward_model: the conversation's
    # messages, rendered with the reward model's own chat template
    chat_template: Literal["policy", "reward_model"] = "policy"
    server: RewardServerConfig = RewardServerConfig()

    @model_validator(mode="after")
    def _a_server_of_another_kind_is_the_users(self) -> RewardModelClientConfig:
        if self.api != "rlsteps" and not self.url:
            raise ValueError(
                f"rm.api={self.api} scores through a server you run (rlsteps starts only its own): set rm.url to it, "
                "or rm.api=rlsteps"
            )
        if self.api == "triton" and self.chat_template == "reward_model":
            raise ValueError(
                "rm.api=triton sends the policy's token ids, as NeMo-Aligner's actors do; rm.chat_template="
                "reward_model needs a server that renders conversations: rm.api=rlsteps or rm.api=vllm"
            )
        return self


class JudgeConfig(Section):
    url: str | None = None
    model: str | None = None
    api_key: str | None = None
    pairing: Literal["circular", "all"] = "circular"
    both_orders: bool = True  # each pair shown both ways round and its two verdicts averaged: position cannot decide
    principle: str | None = None
    concurrency: PositiveInt = 16
    timeout_s: PositiveFloat = 60
    max_retries: NonNegativeInt = 3
    temperature: NonNegativeFloat = 0.6
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 0.95
    max_tokens: PositiveInt = 256
    length_penalty: NonNegativeFloat = 0.0
    on_failure: Literal["mask", "stop"] = "mask"
    # the request's response_format: json_schema (guided decoding to the judgement's schema; vLLM, NIM, SGLang),
    # json_object, or none for servers without structured output
    structured_output: Literal["json_schema", "json_object", "none"] = "json_schema"
    extra_body: dict[str, Any] = {}  # merged into every request body (server-specific options)
    max_parse_failure_rate: Probability = 0.5  # a step whose share of unparsable answers is higher stops the run
    # a step whose share of comparisons that failed in transport (after retries) is higher stops the run; any
    # failure is a warning line, and the end summary counts them
    max_failure_rate: Probability = 0.1


REWARD_SOURCES = ("reward_model", "judge")  # the served sources; a `function` entry is the third kind


class RewardEntry(Section):
    """One term of a rollout's reward: a served source (the rm or judge section's server) or a Python function."""

    source: Literal["reward_model", "judge"] | None = None
    function: str | None = None  # "package.module:function" (rlsteps.engine.rewards.functions)
    weight: float = Field(default=1.0, allow_inf_nan=False)  # 0: logged as reward/<name>, not trained on
    batched: bool = False  # a function called once per step with lists, instead of once per sample
    timeout_s: PositiveFloat = 60  # a function's longest time over one step's samples
    # each reward held within [low, high], then times scale, before the weight sums the terms (both logged as
    # reward/<name>/shaped, beside the raw reward/<name>); engine=nemo_rl: NeMo-RL's grpo.reward_scaling
    clip: tuple[float, float] | None = None
    scale: PositiveFloat = 1.0

    @model_validator(mode="after")
    def _one_kind(self) -> RewardEntry:
        if (self.source is None) == (self.function is None):
            raise ValueError(
                "a rewards entry names exactly one of source (reward_model | judge) or function (package.module:name)"
            )
        if self.function is not None and ":" not in self.function:
            raise ValueError(f"function {self.function!r} must read 'package.module:function'")
        return self

    @property
    def kind(self) -> str:
        return self.source or "function"


def checked_rewards(rewards: dict[str, RewardEntry | None]) -> dict[str, RewardEntry]:
    """The entries in use (a null entry removes one a parent config declares): at least one, named as a metric can
    be, each served source at most once."""
    used = {name: entry for name, entry in rewards.items() if entry is not None}
    if not used:
        raise ValueError(
            "rewards has no entry: name at least one, e.g. rewards.reward_model.source=reward_model or "
            "rewards.NAME.function=package.module:function"
        )
    for name, entry in used.items():
        if not name.replace("_", "").isalnum() or not name.isascii():
            raise ValueError(f"rewards entry {name!r}: a name of letters, digits and _ (it is logged as reward/{name})")
        if entry.clip is not None and not (all(map(math.isfinite, entry.clip)) and entry.clip[0] < entry.clip[1]):
            raise ValueError(f"rewards.{name}.clip {list(entry.clip)}: give [low, high] with low < high, both finite")
    for source in REWARD_SOURCES:
        named = [name for name, entry in used.items() if entry.source == source]
        if len(named) > 1:
            raise ValueError(f"rewards entries {', '.join(named)} all use the {source}: name it once")
    return used


class RewardTerms:
    """What a config with a `rewards:` section (a recipe's, eval/policy's) is asked of it."""

    @property
    def reward_terms(self) -> dict[str, RewardEntry]:
        """The rewards entries in use, in the config's order."""
        return checked_rewards(self.rewards)  # type: ignore[attr-defined]

    def uses_reward(self, kind: str) -> bool:
        """Whether a rewards entry is of this kind: reward_model, judge or function."""
        return any(entry.kind == kind for entry in self.reward_terms.values())


REWARD_MODEL_ONLY = {"reward_model": RewardEntry(source="reward_model")}
JUDGE_ONLY = {"judge": RewardEntry(source="judge")}


def reward_function_import_fix(module: str) -> str:
    """The fix for a reward function whose module does not import: the dry run's and the failed run's words."""
    return f"make {module} importable where the run starts (its folder on PYTHONPATH, or its package installed)"


def reward_function_name_fix(attribute: str, module: str, origin: str | None = None) -> str:
    """The fix for a reward function its module does not define (origin: the module's file, where it is known)."""
    where = f" ({origin})" if origin else ""
    return f"define {attribute} in {module}{where}, or name a function it defines"
