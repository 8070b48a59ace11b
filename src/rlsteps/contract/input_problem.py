"""The error an input the job cannot use raises (rlsteps.contract.input_check, and the Hub resolution it asks)."""

from __future__ import annotations


class InputProblem(Exception):
    """An input the job cannot use: what is wrong, and the fix."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} (fix: {self.fix})" if self.fix else self.message
