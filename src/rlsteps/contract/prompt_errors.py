"""The error a prompt source that cannot be used raises: a JSONL file or a dataset (rlsteps.contract.prompts and
prompt_datasets both raise it)."""

from __future__ import annotations


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message starts with "<path>:<line>:" (or "<path>:" when the file cannot
    be read at all). fix: what to do, where it is not the usual one (a line of the right shape)."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.fix = fix
