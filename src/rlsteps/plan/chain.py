"""The record of a batch pipeline's chain: the jobs its last batch run submitted, in
.rlsteps/pipelines/<pipeline>/chain.json, and what their states mean for a rerun (refused while one is pending or
running: a second chain would write the same run directories)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from rlsteps.errors import UsageError
from rlsteps.launch.base import JobRecord, JobState, JobStatus
from rlsteps.plan.submitted_jobs import job_status, unreadable

RUNS_DIR = Path(".rlsteps") / "pipelines"
CHAIN_FILE = "chain.json"  # in RUNS_DIR/<pipeline>: the batch jobs the last batch run submitted


@dataclass(frozen=True)
class ChainJob:
    """One submitted stage of a batch pipeline, as chain.json records it."""

    stage: str
    launcher: str
    job_id: str
    job_dir: str  # where the job's submission.json is
    submitted: str


@dataclass(frozen=True)
class ChainJobState:
    job: ChainJob
    status: JobStatus


def chain_file(pipeline: str) -> Path:
    return RUNS_DIR / pipeline / CHAIN_FILE


def write_chain(pipeline: str, jobs: list[ChainJob]) -> Path:
    """Write the chain record through a temporary file renamed over it: a reader never sees half a record."""
    path = chain_file(pipeline)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{CHAIN_FILE}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"pipeline": pipeline, "jobs": [asdict(j) for j in jobs]}, indent=2) + "\n")
    os.replace(temporary, path)
    return path


def read_chain(pipeline: str) -> list[ChainJob]:
    """The jobs the last batch run of the pipeline submitted; none when it has no record."""
    path = chain_file(pipeline)
    try:
        return [ChainJob(**job) for job in json.loads(path.read_text())["jobs"]]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise UsageError(
            f"cannot read the record of pipeline {pipeline}'s last batch chain, {path}: {error}",
            fix=f"check that its jobs have ended (`rlsteps jobs list`), then delete {path}",
        ) from None


def chain_states(pipeline: str) -> list[ChainJobState]:
    """Each recorded job's state as its launcher reports it; a state that cannot be read is unknown."""
    states = []
    for job in read_chain(pipeline):
        try:
            record = JobRecord.load(Path(job.job_dir))
        except (OSError, ValueError, TypeError):
            record = None
        if record is None or (record.launcher, record.job_id) != (job.launcher, job.job_id):
            # its job dir is gone: ask by id all the same
            record = JobRecord(job.launcher, job.job_id, job.job_dir, step="", submitted=job.submitted)
        try:
            status = job_status(record)
        except Exception as error:  # as `rlsteps jobs list` does: any backend failure, not Ctrl-C
            status = unreadable(record, error)
        states.append(ChainJobState(job, status))
    return states


def previous_chain(pipeline: str) -> tuple[list[str], UsageError | None]:
    """What the last batch chain of the pipeline means for a new run: notes on jobs whose state is unknown, and
    the refusal while one of its jobs is pending or running (None once all ended)."""
    states = chain_states(pipeline)
    return unknown_notes(states), live_chain_error(pipeline, states)


def unknown_notes(states: list[ChainJobState]) -> list[str]:
    return [
        f"stage {s.job.stage}: the state of {s.job.launcher} job {s.job.job_id}, submitted {s.job.submitted}, is "
        f"unknown ({s.status.detail or 'no detail'}); it is counted as ended"
        for s in states
        if s.status.state is JobState.UNKNOWN
    ]


def live_chain_error(pipeline: str, states: list[ChainJobState]) -> UsageError | None:
    """The refusal of a rerun while a job of the recorded chain is pending or running; None when all ended."""
    live = [s for s in states if not s.status.state.ended and s.status.state is not JobState.UNKNOWN]
    if not live:
        return None
    jobs = ", ".join(f"stage {s.job.stage} job {s.job.job_id} ({s.status.state.value})" for s in live)
    follow = next((s for s in live if s.status.state is JobState.RUNNING), live[0]).job.job_id
    cancel = "; ".join(f"rlsteps jobs cancel {s.job.job_id}" for s in live)
    return UsageError(
        f"pipeline {pipeline}: the chain submitted before has not ended: {jobs}; "
        "a second chain would write the same run directories",
        fix=f"let it end (`rlsteps jobs logs -f {follow}` follows its live stage) or cancel it (`{cancel}`), "
        "then rerun",
    )
