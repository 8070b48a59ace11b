"""The eval step's config schema (eval/policy): a policy, an optional baseline policy, prompts and the RL steps'
reward sources, generated at the config's sampling settings and written as an eval_report.

It builds on the RL recipes' sections (rlsteps.contract.config), so a reward entry, the rm and judge sections, the
data and sampling keys mean here what they mean there. Importing it registers the schema in STEP_SCHEMAS under the
algorithm `eval` (the compiler and the worker import it before they look a schema up). Torch-free.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, NonNegativeInt, PositiveInt, model_validator

from rlsteps.contract.config import STEP_SCHEMAS, DataConfig, RunConfig, SamplingConfig, TinyWorldConfig, VllmConfig
from rlsteps.contract.config_types import Probability, Section
from rlsteps.contract.reward_config import (
    JudgeConfig,
    RewardEntry,
    RewardModelClientConfig,
    RewardTerms,
    checked_rewards,
)

REPORT_NAME = "report"  # the output artifact is <output.dir>/report, as the manifest names it


class EvalInputs(Section):
    model_config = ConfigDict(extra="allow", frozen=True)  # reward_model, judge_model where a rewards entry uses them
    prompts: str
    policy: str
    baseline: str | None = None  # the policy it is compared with (the RL step's input policy); None: no comparison


class GenerationConfig(Section):
    """Who generates and how: the RL steps' rollout keys (rollout.backend, rollout.sampling, rollout.vllm)."""

    backend: Literal["auto", "builtin", "vllm"] = "auto"
    generation_batch_size: PositiveInt | None = None  # rows per built-in sampler batch; None: sized to the device
    sampling: SamplingConfig = SamplingConfig()  # the k samples' settings; the greedy response takes max_new_tokens
    vllm: VllmConfig = VllmConfig()


class EvalSettings(Section):
    num_prompts: PositiveInt | None = None  # the first N prompts of the file; None: every prompt
    greedy: bool = True  # one greedy response per prompt: the means, the judge's comparison and the paired gains
    samples_per_prompt: NonNegativeInt = 4  # n sampled responses per prompt at generation.sampling; 0: none
    pass_k: list[PositiveInt] = [1]  # the k of pass@k, each at most samples_per_prompt
    # the function terms that decide correctness, and the reward at or above which a response is correct: their
    # accuracy (greedy) and pass@k (sampled) are reported
    correct_at: dict[str, float] = {}
    batch_prompts: PositiveInt = 16  # prompts generated, scored and appended to results.jsonl at a time
    bootstrap_resamples: PositiveInt = 2000
    confidence: Probability = 0.95


class EvalOutput(Section):
    dir: str  # the run directory: results.jsonl (per prompt, resumable) and the eval_report <dir>/report


class EvalConfig(RewardTerms, Section):
    """eval/policy: what a policy scores on the config's reward sources, and against a baseline policy."""

    algorithm: Literal["eval"]
    seed: NonNegativeInt = 1234
    run: RunConfig = RunConfig()
    inputs: EvalInputs
    data: DataConfig = DataConfig()
    generation: GenerationConfig = GenerationConfig()
    rewards: dict[str, RewardEntry | None] = {"reward_model": RewardEntry(source="reward_model")}
    rm: RewardModelClientConfig = RewardModelClientConfig()
    judge: JudgeConfig = JudgeConfig()
    eval: EvalSettings = EvalSettings()
    output: EvalOutput
    tiny_world: TinyWorldConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> EvalConfig:
        terms = checked_rewards(self.rewards)
        if not self.eval.greedy and not self.eval.samples_per_prompt:
            raise ValueError("eval.greedy=false with eval.samples_per_prompt=0 generates nothing: set either")
        if self.uses_reward("judge") and not self.inputs.baseline:
            raise ValueError(
                "a judge compares the policy with a baseline: set inputs.baseline, or remove rewards.judge"
            )
        if self.uses_reward("judge") and not self.eval.greedy:
            raise ValueError("the judge compares greedy responses: set eval.greedy=true, or remove rewards.judge")
        too_big = [k for k in self.eval.pass_k if k > self.eval.samples_per_prompt]
        if self.eval.correct_at and too_big:
            raise ValueError(
                f"eval.pass_k {too_big} exceeds eval.samples_per_prompt ({self.eval.samples_per_prompt}): raise "
                "eval.samples_per_prompt or lower eval.pass_k"
            )
        for name in self.eval.correct_at:
            if name not in terms or terms[name].kind != "function":
                functions = [n for n, e in terms.items() if e.kind == "function"] or ["none"]
                raise ValueError(
                    f"eval.correct_at.{name}: correctness is decided by a function term of rewards; the function "
                    f"terms are {', '.join(functions)}"
                )
        return self


STEP_SCHEMAS["eval"] = EvalConfig
