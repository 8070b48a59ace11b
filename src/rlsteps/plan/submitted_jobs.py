"""Submitted jobs, found again from their records: status, logs and cancel through each job's launcher.

A record is the `submission.json` in a job directory. They are looked for under ./.rlsteps/jobs and
under the `job_dir` of every profile that sets one (the shared filesystem of a cluster), so a job
is found from the directory it was submitted from and from anywhere that knows its profile.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rlsteps.errors import RlstepsError, UsageError
from rlsteps.launch.base import RECORD_FILE, JobRecord, JobState, JobStatus, get_launcher
from rlsteps.plan.job_dir import JOBS_DIR
from rlsteps.plan.profiles import load_profiles, resolve_profile


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


def list_jobs(roots: list[Path] | None = None) -> list[JobView]:
    """Every job with its status; a status that cannot be read says why instead of failing the list.

    A remote workspace (a record's `workspace`, as Lepton's name one) that failed once is not asked again for the
    rest of the list: an unreachable API would cost its timeout for each of its jobs. Other jobs are each asked.
    """
    views, failed = [], {}
    for record in find_records(roots):
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
        views.append(JobView(record, status))
    return views


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
