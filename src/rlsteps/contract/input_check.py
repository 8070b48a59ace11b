"""What an unusable input says, and the check a job makes of the inputs only its cluster can see.

The submitting machine checks every input it can see (rlsteps.artifacts.inputs). An input on a path the
profile declares as the cluster's (a Lepton mount, a Slurm `cluster_paths` entry) cannot be checked there:
the job checks it itself, before it starts a server or loads a policy, with the same messages and exit 3.
What it needs travels in job.yaml as `inputs_in_job`, one InputInJob each; the job needs no catalog.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from rlsteps.contract.detectors import detect, exists
from rlsteps.contract.input_problem import InputProblem
from rlsteps.contract.weight_files import weight_damage

EXIT_INPUT = 3  # as rlsteps.errors.ArtifactError: a missing, malformed or mistyped input artifact
PROMPT_FILE_FIX = 'each line must be {"prompt": "..."} or {"messages": [{"role", "content"}, ...]}'


def missing(name: str, key: str, ref: str, wanted: str) -> InputProblem:
    return InputProblem(f"input '{name}': {ref} does not exist", fix=f"pass {key}=PATH to a {wanted}")


def wrong_type(name: str, ref: str, detected: Iterable[str], wanted: str) -> str:
    what = " or ".join(detected) or "not a recognised artifact"
    return f"input '{name}': {ref} is {what}, but a {wanted} is required"


@dataclass(frozen=True)
class InputInJob:
    """One input the job checks itself, with all the catalog knows that the check needs."""

    name: str
    key: str
    ref: str
    required_type: str
    wanted: str  # the required type as messages name it, e.g. "policy (checkpoint_hf or checkpoint_megatron)"
    accepted: list[str]  # every type that is a required_type
    detectors: dict[str, str | None] = field(default_factory=dict)  # every known type -> its detector

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check(self) -> None:
        """Raise InputProblem when the input is absent or of no accepted type; parse a prompt file whole. A Hugging
        Face Hub id is resolved first (from the cache, or fetched into it where the Hub is reachable)."""
        where = self.location()
        if not exists(where):
            raise missing(self.name, self.key, self.ref, self.wanted)
        detected = detect(where, self.detectors)
        if not set(detected) & set(self.accepted):
            raise InputProblem(
                wrong_type(self.name, self.ref, detected, self.wanted), fix=f"point {self.key} at a {self.wanted}"
            )
        if "prompt_dataset" in detected:  # read with the run's data.* keys before the policy loads
            return
        problem = (
            prompt_file_problem(self.name, where)
            if "prompt_jsonl" in detected
            else damaged_weights(self.name, self.key, where)
        )
        if problem is not None:
            raise problem

    def location(self) -> str:
        """Where the input's files are: the reference, or a Hub id's snapshot folder in the job's cache."""
        from rlsteps.contract.hub import is_hub_id, snapshot

        return str(snapshot(self.name, self.key, self.ref)) if is_hub_id(self.ref) else self.ref


def prompt_file_problem(
    name: str,
    ref: str,
    tokenizer: Any = None,
    max_prompt_tokens: int | None = None,
    say: Callable[[str], None] | None = None,
    options: Any = None,
) -> InputProblem | None:
    """Every row of a prompt file or dataset parsed, and with a tokenizer measured against max_prompt_tokens: the
    first bad one, or None. say: a large file's progress; options: the run's data.* keys (PromptOptions)."""
    from rlsteps.contract.prompts import NO_OPTIONS, PromptFileError, load_prompts  # torch-free

    try:
        load_prompts(ref, tokenizer, max_prompt_tokens, say, options or NO_OPTIONS)
    except PromptFileError as error:
        return InputProblem(f"input '{name}': {error}", fix=error.fix or PROMPT_FILE_FIX)
    return None


def damaged_weights(name: str, key: str, ref: str) -> InputProblem | None:
    """A model folder whose weight files are cut short or broken, found from their headers and sizes without
    reading a weight; None when nothing is wrong that way."""
    damage = weight_damage(ref)
    if damage is None:
        return None
    return InputProblem(
        f"input '{name}': {damage}",
        fix=f"copy or download it again (a copy or a save cut short leaves such files), or point {key} at a whole one",
    )


def check_inputs_in_job(records: Iterable[dict[str, Any]]) -> list[InputInJob]:
    """Check every input job.yaml lists under inputs_in_job; raise InputProblem for the first unusable one."""
    inputs = [InputInJob(**record) for record in records]
    for item in inputs:
        item.check()
    return inputs
