"""`rm.url=job:ID` and `judge.url=job:ID`: a run scores through a shared server (`rlsteps serve rm|judge -b PROFILE`),
named by its job id (or its job directory's name), resolved when the run is compiled to the address the server's job
wrote once it answered (launch.shared_server). A server that is unknown, of the other kind, ended, or not answering
yet is refused in one line with what to do."""

from __future__ import annotations

from rlsteps.artifacts.inputs import lookup, with_value
from rlsteps.errors import UsageError
from rlsteps.launch import shared_server
from rlsteps.launch.base import JobRecord, JobState
from rlsteps.launch.job import Job
from rlsteps.launch.server_alloc import URL_KEYS
from rlsteps.plan.submitted_jobs import find_job, find_records, job_status

SCHEME = "job:"
WHAT = {"rm": "reward model", "judge": "judge"}


def with_shared_servers(job: Job) -> Job:
    """The job with each `job:ID` URL replaced by that server's address, and a note naming it."""
    config, notes = job.config, []
    for serves, key in URL_KEYS.items():
        value = lookup(config, key)
        if isinstance(value, str) and value.startswith(SCHEME):
            record = server_record(value.removeprefix(SCHEME), serves, key)
            url = server_url(record, key)
            config = with_value(config, key, url)
            notes.append(f"{key}={value}: the {WHAT[serves]} server of Slurm job {record.job_id}, at {url}")
    if not notes:
        return job
    return job.model_copy(update={"config": config, "notes": [*job.notes, *notes]})


def server_record(ref: str, serves: str, key: str) -> JobRecord:
    """The record of the server job `ref` names, which must serve `serves`."""
    start = (
        f"start one: rlsteps serve {serves} --model PATH -b PROFILE (`rlsteps jobs list --step 'serve/*'` lists them)"
    )
    records = find_records()
    try:
        record = find_job(ref, records) if ref else None
    except UsageError:
        record = None
    if record is None:
        raise UsageError(f"{key}={SCHEME}{ref}: no job '{ref}' is recorded here", fix=start)
    found = shared_server.serves(record)
    if found is None:
        raise UsageError(
            f"{key}={SCHEME}{ref}: job {record.job_id} is a run of {record.step}, not a server",
            fix=f"name a server's job; {start}",
        )
    if found != serves:
        other = URL_KEYS[found]
        raise UsageError(
            f"{key}={SCHEME}{ref}: job {record.job_id} serves a {WHAT[found]}, not a {WHAT[serves]}",
            fix=f"pass it as {other}={SCHEME}{ref}, or name a {WHAT[serves]} server's job",
        )
    return record


def server_url(record: JobRecord, key: str) -> str:
    """The URL the server's job wrote once it answered, while it runs."""
    serves = shared_server.serves(record)
    status = job_status(record)
    name = f"{key}={SCHEME}{record.job_id}: the {WHAT[serves]} server's job {record.job_id}"
    if status.state.ended or status.state is JobState.UNKNOWN:
        raise UsageError(
            f"{name} is {status.state.value} ({status.detail})",
            fix=f"start another: rlsteps serve {serves} --model PATH -b PROFILE, and pass {key}={SCHEME}NEW_ID",
        )
    address = shared_server.served(record)
    if status.state is JobState.PENDING or address is None:
        waiting = "is waiting for its nodes" if status.state is JobState.PENDING else "is not answering yet"
        raise UsageError(
            f"{name} {waiting} ({status.detail})",
            fix=f"wait until `rlsteps jobs status {record.job_id}` shows its address (`rlsteps jobs logs -f "
            f"{record.job_id}` follows it), then run this again",
        )
    return str(address["url"])
