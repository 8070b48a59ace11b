"""Submitted jobs, found again from their records: status, logs and cancel through each job's launcher.

A record is the `submission.json` in a job directory. They are looked for under ./.rlsteps/jobs and
under the `job_dir` of every profile that sets one (the shared filesystem of a cluster), so a job
is found from the directory it was submitted from and from anywhere that knows its profile.
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from rlsteps.errors import RlstepsError, UsageError
from rlsteps.launch.base import LAUNCHERS, RECORD_FILE, JobRecord, JobState, JobStatus, get_launcher
from rlsteps.plan.job_dir import JOBS_DIR
from rlsteps.plan.profiles import load_profiles, resolve_profile

# the states a job list may ask for beyond a JobState's own: each the states it stands for
STATE_GROUPS = {
    "done": (JobState.SUCCEEDED,),
    "active": (JobState.PENDING, JobState.RUNNING),
    "ended": (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED),
}
AGO = re.compile(r"(\d+)\s*([mhdw])")
AGO_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(frozen=True)
class JobView:
    record: JobRecord
    status: JobStatus

    @property
    def name(self) -> str:
        return Path(self.record.job_dir).name

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self.record),
            "name": self.name,
            "state": self.status.state.value,
            "detail": self.status.detail,
        }


@dataclass(frozen=True)
class JobSelection:
    """Which jobs a list shows: of these steps (ids or globs: rl/*), states, launchers, submitted since a moment;
    of those the `last` newest. Empty: any."""

    steps: tuple[str, ...] = ()
    states: frozenset[JobState] = frozenset()
    launchers: tuple[str, ...] = ()
    since: datetime | None = None
    last: int | None = None

    @classmethod
    def parse(
        cls,
        steps: Iterable[str] = (),
        states: Iterable[str] = (),
        launchers: Iterable[str] = (),
        since: str | None = None,
        last: int | None = None,
        now: datetime | None = None,
    ) -> JobSelection:
        """A selection from the command line's words; a word it cannot read is a UsageError with the fix."""
        unknown = sorted(set(launchers) - set(LAUNCHERS))
        if unknown:
            raise UsageError(f"no launcher '{unknown[0]}'", fix=f"launchers: {', '.join(LAUNCHERS)}")
        if last is not None and last < 1:
            raise UsageError(f"--last {last} keeps no job", fix="--last N with N >= 1: the N newest jobs")
        moment = None if since is None else parse_since(since, now or datetime.now().astimezone())
        return cls(tuple(steps), frozenset(s for word in states for s in _states(word)), tuple(launchers), moment, last)

    def admits(self, record: JobRecord) -> bool:
        """Whether the record passes what needs no status: its step, launcher and submission time."""
        return (
            (not self.steps or any(fnmatch.fnmatchcase(record.step, pattern) for pattern in self.steps))
            and (not self.launchers or record.launcher in self.launchers)
            and (self.since is None or _instant(record.submitted) >= self.since.timestamp())
        )

    def admits_state(self, state: JobState) -> bool:
        return not self.states or state in self.states

    @property
    def is_everything(self) -> bool:
        return self == JobSelection()


def _states(word: str) -> tuple[JobState, ...]:
    if word in STATE_GROUPS:
        return STATE_GROUPS[word]
    try:
        return (JobState(word),)
    except ValueError:
        known = [s.value for s in JobState] + list(STATE_GROUPS)
        close = difflib.get_close_matches(word, known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"no job state '{word}'", fix=f"{hint}states: {', '.join(known)}") from None


def parse_since(text: str, now: datetime) -> datetime:
    """A moment from a time ago (30m, 6h, 2d, 1w, or several: 1d12h) or a date or time (2026-11-25,
    2026-11-25T08:00, in this machine's time zone unless it names one)."""
    words = text.strip().lower().replace(" ", "")
    if words and AGO.sub("", words) == "":
        ago = timedelta()
        for number, unit in AGO.findall(words):
            ago += timedelta(**{AGO_UNITS[unit]: int(number)})
        return now - ago
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"--since {text} is no time ago or date", fix="--since 6h, 2d, 1w, or a date: --since 2026-11-25"
        ) from None
    return moment if moment.tzinfo is not None else moment.astimezone()


def job_roots() -> list[Path]:
    """./.rlsteps/jobs, then each profile's job_dir, without repeats."""
    roots = [Path.cwd() / JOBS_DIR]
    for name in load_profiles():
        try:
            job_dir = resolve_profile(name).launcher_settings.get("job_dir")
        except UsageError:
            continue  # a broken profile is reported when it is used, not here
        if job_dir and Path(str(job_dir)).expanduser().is_dir():  # one not made here holds no record (the shipped
            roots.append(Path(str(job_dir)).expanduser().absolute())  # example profiles' cluster folders)
    return list(dict.fromkeys(roots))


def find_records(roots: list[Path] | None = None) -> list[JobRecord]:
    """Every readable record under the roots, oldest first; a job recorded in two places is listed once."""
    found: dict[tuple[str, str, str], JobRecord] = {}
    for root in job_roots() if roots is None else roots:
        for path in sorted(root.glob(f"*/{RECORD_FILE}")):
            try:
                record = JobRecord.load(path.parent)
            except (OSError, ValueError, TypeError):
                continue  # a record being written, or not ours
            found.setdefault((record.launcher, record.job_id, record.job_dir), record)
    return sorted(found.values(), key=lambda r: (_instant(r.submitted), Path(r.job_dir).name))


def _instant(iso_time: str) -> float:
    """A record's submission time as a moment (records written in other time zones compare as they happened); an
    unreadable one sorts first."""
    try:
        return datetime.fromisoformat(iso_time).timestamp()
    except ValueError:
        return float("-inf")


def find_job(ref: str, records: list[JobRecord] | None = None) -> JobRecord:
    """A job by its id (a local job's directory name, a Slurm job id, ...), its job directory's name or path, a local
    job's pid, or a unique prefix of the name."""
    records = find_records() if records is None else records
    matches = [r for r in records if ref in (r.job_id, Path(r.job_dir).name, r.job_dir, str(r.extra.get("pid")))]
    if not matches:
        matches = [r for r in records if Path(r.job_dir).name.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    names = [Path(r.job_dir).name for r in matches]
    if matches:
        raise UsageError(
            f"'{ref}' matches {len(matches)} jobs: {', '.join(names)}", fix="name one by its job directory"
        )
    close = difflib.get_close_matches(ref, [Path(r.job_dir).name for r in records] + [r.job_id for r in records], n=3)
    hint = f"did you mean {', '.join(close)}?" if close else "`rlsteps jobs list` shows the jobs found"
    raise UsageError(f"no job '{ref}' under {', '.join(str(r) for r in job_roots())}", fix=hint)


def job_status(record: JobRecord) -> JobStatus:
    return get_launcher(record.launcher).status(record)


def list_jobs(roots: list[Path] | None = None, selection: JobSelection = JobSelection()) -> list[JobView]:
    """The selected jobs with their status, oldest first; a status that cannot be read says why instead of failing
    the list. Only the jobs that pass the selection's step, launcher and time are asked their status, newest first,
    until `last` of them are in a selected state."""
    records = [record for record in find_records(roots) if selection.admits(record)]
    views = (view for view in _with_statuses(reversed(records)) if selection.admits_state(view.status.state))
    return list(reversed(list(itertools.islice(views, selection.last))))


def _with_statuses(records: Iterable[JobRecord]) -> Iterator[JobView]:
    """Each record with its status, asked as the list is read.

    A remote workspace (a record's `workspace`, as Lepton's name one) that failed once is not asked again for the
    rest of the list: an unreachable API would cost its timeout for each of its jobs. Other jobs are each asked.
    """
    failed: dict[tuple[str, str], str] = {}
    for record in records:
        workspace = record.extra.get("workspace")
        backend = (record.launcher, str(workspace)) if workspace else None
        if backend in failed:
            status = JobStatus(JobState.UNKNOWN, failed[backend])
        else:
            try:
                status = job_status(record)
            except Exception as error:  # any backend failure, the SDK's and the network's too; not Ctrl-C
                status = unreadable(record, error)
                if backend:
                    failed[backend] = status.detail
        yield JobView(record, status)


def unreadable(record: JobRecord, error: Exception) -> JobStatus:
    """The status of a job whose launcher failed to report one: unknown, saying why."""
    return JobStatus(JobState.UNKNOWN, f"{record.launcher} status unavailable: {_reason(error)}")


def _reason(error: Exception) -> str:
    if isinstance(error, RlstepsError):
        return str(error)  # the message and its fix
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def job_logs(record: JobRecord, follow: bool = False) -> Iterator[str]:
    return get_launcher(record.launcher).logs(record, follow=follow)


def cancel_job(record: JobRecord) -> tuple[JobStatus, bool]:
    """Cancel a job that has not ended; returns its status afterwards and whether a cancel was sent."""
    before = job_status(record)
    if before.state.ended:
        return before, False
    get_launcher(record.launcher).cancel(record)
    return job_status(record), True
