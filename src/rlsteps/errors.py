"""Errors a user can act on. Each carries its exit code and, where known, the fix."""

from __future__ import annotations


class RlstepsError(Exception):
    exit_code = 1

    def __init__(self, message: str, fix: str | None = None):
        from rlsteps.secrets import mask_text  # a URL's password never reaches what the user is shown

        message, fix = mask_text(message), (mask_text(fix) if fix else fix)
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} (fix: {self.fix})" if self.fix else self.message

    def __reduce__(self):  # sent to another process (the main one's error to every process), the fix goes with it
        return type(self), (self.message, self.fix)


class UsageError(RlstepsError):
    """Bad command line, unknown step, unknown override key, invalid config: exit 2."""

    exit_code = 2


class ArtifactError(RlstepsError):
    """An input artifact is missing or of the wrong type: exit 3."""

    exit_code = 3


class RunFailed(RlstepsError):
    """The job ran and failed: exit 1."""

    exit_code = 1


class InputRefusedInJob(RunFailed):
    """The job ran and refused an input it checks itself (on a cluster path, or one only the policy's tokenizer
    can judge): exit 3, as a bad input is at submission."""

    exit_code = ArtifactError.exit_code


class DiskFull(RunFailed):
    """The run directory's disk has no room for what the run writes next: exit 1, with the directory and the
    megabytes to free."""


class Interrupted(RlstepsError):
    """Ctrl-C: the run was interrupted (its step in progress ended and checkpointed, or not begun). Exit 130, as a shell
    reports SIGINT; the fix says from which step a rerun starts."""

    exit_code = 130


class Terminated(RlstepsError):
    """SIGTERM or SIGHUP: the run was stopped. Exit 143, as a shell reports SIGTERM; the fix says from which step
    a rerun starts."""

    exit_code = 143
