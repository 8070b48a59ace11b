"""The prompts a run reads from this machine, checked here before it starts: every row of a prompt file or dataset
parsed (a bad line, an empty prompt, a byte that is not UTF-8 is exit 3 with its file:line, or its split and row, in
seconds), and in a dry run also measured against data.max_prompt_tokens with the policy's tokenizer, read without
torch, so the dry run refuses what the run would refuse. A dataset is read with the run's data.* keys (its column,
split and chat template arguments).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsteps.artifacts.inputs import ResolvedInput, lookup
from rlsteps.errors import ArtifactError

PROMPT_KINDS = frozenset({"prompt_jsonl", "prompt_dataset"})
# the files a Hugging Face tokenizer is read from: a policy folder with none of them has no tokenizer to load
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
    "sentencepiece.bpe.model",
)  # fmt: skip
NEMO_RL_DATASET_FIX = (
    "write the prompts as JSONL (Dataset.to_json(PATH, lines=True)) and pass that file, or run on the embedded engine"
)


@dataclass(frozen=True)
class Measure:
    """How the run reads and measures its prompts: the policy's tokenizer (None: not measured here), its limit, the
    inputs it measures, and its data.* keys."""

    tokenizer: Any
    max_prompt_tokens: int | None
    inputs: frozenset[str]
    data: dict[str, Any] = field(default_factory=dict, hash=False)
    engine: str = "embedded"


def measure_of(config: dict[str, Any], say: Callable[[str], None] | None = None) -> Measure:
    """The measure the run will apply (an embedded recipe with data.max_prompt_tokens and a policy here: its
    tokenizer; else none, said when there is a limit the dry run cannot apply), with the keys it reads rows with."""
    limit, engine = lookup(config, "data.max_prompt_tokens"), str(config.get("engine") or "embedded")
    measured = {"prompts", "val_prompts"} if lookup(config, "validation.interval") else {"prompts"}
    tokenizer = None
    if isinstance(limit, int) and engine != "nemo_rl":
        tokenizer, why = _policy_tokenizer(lookup(config, "inputs.policy"))
        if tokenizer is None and say is not None:
            say(f"prompt lengths against data.max_prompt_tokens are measured when the run starts: {why}")
    data = lookup(config, "data")
    _say_unread_kwargs(tokenizer, data, say)
    return Measure(tokenizer, limit, frozenset(measured), dict(data) if isinstance(data, dict) else {}, engine)


def _say_unread_kwargs(tokenizer: Any, data: Any, say: Callable[[str], None] | None) -> None:
    from rlsteps.contract.prompt_tokenizer import unread_kwargs_note

    kwargs = data.get("chat_template_kwargs") if isinstance(data, dict) else None
    note = unread_kwargs_note(getattr(tokenizer, "chat_template", None), kwargs)
    if note is not None and say is not None:
        say(note)


def _policy_tokenizer(policy: Any) -> tuple[Any, str]:
    """The policy's tokenizer read from its files (a Hub id's in the cache here), or (None, why not)."""
    from rlsteps.contract.hub import cached_snapshot, is_hub_id
    from rlsteps.contract.prompt_tokenizer import tokenizer_from_files  # neither torch nor transformers

    if not policy:
        return None, "inputs.policy is not set"
    folder = cached_snapshot(str(policy)) if is_hub_id(str(policy)) else policy
    if folder is None:
        return None, f"{policy} is not in the Hugging Face cache here"
    return tokenizer_from_files(str(folder))


def checked_prompt_files(
    inputs: list[ResolvedInput], measure: Measure | None = None, say: Callable[[str], None] | None = None
) -> list[ResolvedInput]:
    """The inputs, each prompt file or dataset given and found read whole (and measured): malformed at its first bad
    row. Without a measure, datasets are left to the run (their rows are read with its data.* keys)."""
    return [_checked(item, measure, say) for item in inputs]


def refuse_bad_prompt_files(inputs: list[ResolvedInput], measure: Measure | None = None) -> None:
    """ArtifactError (exit 3) naming the first bad row of any prompt file given."""
    for item in checked_prompt_files(inputs, measure):
        if item.status == "malformed":
            raise ArtifactError(str(item.problem), fix=item.fix)


def _checked(item: ResolvedInput, measure: Measure | None, say: Callable[[str], None] | None) -> ResolvedInput:
    from rlsteps.contract.input_check import InputProblem, prompt_file_problem  # torch-free
    from rlsteps.contract.prompts import prompt_options

    kinds = PROMPT_KINDS & set(item.detected)
    if item.status != "ok" or not kinds or ("prompt_dataset" in kinds and measure is None):
        return item
    if "prompt_dataset" in kinds and measure.engine == "nemo_rl":
        problem = InputProblem(
            f"input '{item.name}': {item.ref} is a Hugging Face dataset; NeMo-RL's job reads JSONL prompt files",
            fix=NEMO_RL_DATASET_FIX,
        )
        return item.malformed(problem)
    options = prompt_options(measure.data if measure else None, item.name)
    if measure is not None and measure.tokenizer is not None and item.name in measure.inputs:
        tokenizer, limit = measure.tokenizer, measure.max_prompt_tokens
        problem = prompt_file_problem(item.name, item.location, tokenizer, limit, say, options)
    else:
        problem = prompt_file_problem(item.name, item.location, options=options)
    return item if problem is None else item.malformed(problem)


def with_policy_tokenizer(inputs: list[ResolvedInput]) -> list[ResolvedInput]:
    """The inputs, a Hugging Face policy folder that holds no tokenizer file marked malformed: the run renders and
    measures its prompts with the policy's tokenizer before anything else, and would stop there (exit 3)."""
    return [_tokenizer_checked(item) for item in inputs]


def _tokenizer_checked(item: ResolvedInput) -> ResolvedInput:
    from rlsteps.contract.input_check import InputProblem  # torch-free

    if item.name != "policy" or item.status != "ok" or "checkpoint_hf" not in item.detected:
        return item
    folder = Path(item.location)
    if not folder.is_dir() or any((folder / name).is_file() for name in TOKENIZER_FILES):
        return item
    problem = InputProblem(
        f"input 'policy': {item.ref} holds no tokenizer (none of {', '.join(TOKENIZER_FILES[:3])}, ...): the run "
        "renders and measures its prompts with it",
        fix=f"save the policy's tokenizer into it (tokenizer.save_pretrained), or point {item.key} at a checkpoint "
        "that has one",
    )
    return item.malformed(problem)
