"""The prompt files a run reads from this machine, checked here before it starts: every line parsed (a bad line, an
empty prompt, a byte that is not UTF-8 is exit 3 with its file:line in seconds), and in a dry run also measured
against data.max_prompt_tokens with the policy's tokenizer, read without torch, so the dry run refuses what the run
would refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlsteps.artifacts.inputs import ResolvedInput, lookup
from rlsteps.errors import ArtifactError

PROMPT_TYPE = "prompt_jsonl"


@dataclass(frozen=True)
class Measure:
    """How the run measures its prompts: the policy's tokenizer, its limit, and the inputs it measures."""

    tokenizer: Any
    max_prompt_tokens: int
    inputs: frozenset[str]


def measure_of(config: dict[str, Any], say: Callable[[str], None] | None = None) -> Measure | None:
    """The measure the run will apply (an embedded recipe with data.max_prompt_tokens and a policy here), or None
    (said, when there is a limit the dry run cannot apply)."""
    limit, policy = lookup(config, "data.max_prompt_tokens"), lookup(config, "inputs.policy")
    if not isinstance(limit, int) or config.get("engine") == "nemo_rl":
        return None
    from rlsteps.contract.prompt_tokenizer import tokenizer_from_files  # neither torch nor transformers

    tokenizer, why = tokenizer_from_files(str(policy)) if policy else (None, "inputs.policy is not set")
    if tokenizer is None:
        if say is not None:
            say(f"prompt lengths against data.max_prompt_tokens are measured when the run starts: {why}")
        return None
    measured = {"prompts", "val_prompts"} if lookup(config, "validation.interval") else {"prompts"}
    return Measure(tokenizer, limit, frozenset(measured))


def checked_prompt_files(
    inputs: list[ResolvedInput], measure: Measure | None = None, say: Callable[[str], None] | None = None
) -> list[ResolvedInput]:
    """The inputs, each prompt file given and found read whole (and measured): malformed at its first bad line."""
    return [_checked(item, measure, say) for item in inputs]


def refuse_bad_prompt_files(inputs: list[ResolvedInput]) -> None:
    """ArtifactError (exit 3) naming the first bad line of any prompt file given."""
    for item in checked_prompt_files(inputs):
        if item.status == "malformed":
            raise ArtifactError(str(item.problem), fix=item.fix)


def _checked(item: ResolvedInput, measure: Measure | None, say: Callable[[str], None] | None) -> ResolvedInput:
    from rlsteps.contract.input_check import prompt_file_problem  # torch-free

    if item.required_type != PROMPT_TYPE or item.status != "ok":
        return item
    if measure is not None and item.name in measure.inputs:
        problem = prompt_file_problem(item.name, str(item.ref), measure.tokenizer, measure.max_prompt_tokens, say)
    else:
        problem = prompt_file_problem(item.name, str(item.ref))
    return item if problem is None else item.malformed(problem)
