"""The DGX Cloud Lepton API through the leptonai SDK: the client, one-line errors, secrets, job state and logs.

Credentials come from `lep login` or LEPTON_WORKSPACE_ID / LEPTON_WORKSPACE_TOKEN and are never printed or
written; the SDK's own error text can quote a token hint, so only its type or the redacted API answer is shown.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from rlsteps.errors import RunFailed, UsageError
from rlsteps.launch.base import JobState, JobStatus
from rlsteps.launch.lepton_spec import LOGIN_HINT

INSTALL_HINT = "pip install 'rlsteps[lepton]'"
LOG_LINES = 5000  # a log read without follow shows at most this many recent lines

# Lepton's job states -> ours. Archived (finished and moved out of the live list) is decided by its counters.
STATES = {
    **dict.fromkeys(["Queueing", "Awaiting", "Starting", "PendingRetry", "Restarting"], JobState.PENDING),
    "Running": JobState.RUNNING,
    "Completed": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    **dict.fromkeys(["Stopping", "Stopped", "Terminating", "Deleting", "Deleted"], JobState.CANCELLED),
}

T = TypeVar("T")


def sdk_installed() -> bool:
    """Whether the leptonai package is there, found without importing it (an import reads the login record)."""
    import importlib.util

    return importlib.util.find_spec("leptonai") is not None


def require_sdk() -> None:
    """The SDK, 0.47 or later; importing it reads the `lep login` record, which can be unreadable."""
    try:
        import leptonai.api.v2.types.job  # noqa: F401  (the v2 job types came with leptonai 0.47)
    except ImportError as err:
        raise UsageError(
            f"the Lepton launcher needs the leptonai SDK, 0.47 or later ({err})", fix=INSTALL_HINT
        ) from None
    except Exception as err:  # a damaged ~/.cache/lepton/workspace_info.yaml: YAML, type or validation errors
        raise UsageError(
            f"the leptonai SDK cannot read its `lep login` record ({type(err).__name__})",
            fix=f"remove ~/.cache/lepton/workspace_info.yaml and {LOGIN_HINT}",
        ) from None


def client(workspace: str | None) -> Any:
    """An APIClient for the workspace (default: LEPTON_WORKSPACE_ID, else the `lep login` one).

    Every way the SDK fails to build one is a one-line UsageError. The token is looked for first, in the SDK's
    order (LEPTON_WORKSPACE_TOKEN, then the login record): without one, leptonai 0.47 fails with a TypeError.
    """
    require_sdk()
    from leptonai.api.v2.client import APIClient
    from leptonai.api.v2.workspace_record import WorkspaceRecord

    wanted = workspace or os.environ.get("LEPTON_WORKSPACE_ID") or WorkspaceRecord.get_current_workspace_id()
    if not wanted:
        raise UsageError("no DGX Cloud Lepton workspace to talk to", fix=LOGIN_HINT)
    wanted, _, inline_token = wanted.partition(":")  # LEPTON_WORKSPACE_ID may be a whole credential, ID:TOKEN
    login = WorkspaceRecord.get(wanted)
    token = inline_token or os.environ.get("LEPTON_WORKSPACE_TOKEN") or (login.auth_token if login else None)
    if not token:
        raise UsageError(f"no token for DGX Cloud Lepton workspace {wanted}", fix=LOGIN_HINT)
    try:
        return APIClient(workspace_id=wanted, auth_token=token)
    except Exception as err:  # its errors can carry a token hint: the type alone is shown
        raise UsageError(
            f"cannot set up a client for DGX Cloud Lepton workspace {wanted} ({type(err).__name__})", fix=LOGIN_HINT
        ) from None


def call(what: str, request: Callable[[], T]) -> T:
    """One SDK call; its failure becomes a one-line error (the SDK redacts credentials from response text)."""
    import requests

    try:
        return request()
    except requests.RequestException as err:
        raise RunFailed(f"cannot reach the Lepton API to {what}: {type(err).__name__}", fix=LOGIN_HINT) from None
    except RuntimeError as err:  # the SDK's ClientError / ServerError
        refused = getattr(getattr(err, "response", None), "status_code", None) in (401, 403)
        raise RunFailed(
            f"Lepton API: could not {what}: {str(err).splitlines()[0]}", fix=LOGIN_HINT if refused else None
        ) from None


def node_group_id(lepton: Any, name: str) -> str:
    groups = call("list node groups", lepton.nodegroup.list_all)
    for group in groups:
        if name in (group.metadata.name, group.metadata.id_):
            return group.metadata.id_
    known = ", ".join(g.metadata.name or g.metadata.id_ for g in groups) or "none"
    raise UsageError(
        f"node group '{name}' is not in workspace {lepton.workspace_id}", fix=f"set node_group to one of: {known}"
    )


def create_secrets(lepton: Any, secrets: dict[str, str]) -> None:
    """Store each value as a new private workspace secret; a name that exists already is refused, never replaced."""
    if not secrets:
        return
    from leptonai.api.v2.types.common import LeptonVisibility
    from leptonai.api.v2.types.secret import SecretItem

    items = [SecretItem(name=n, value=v, visibility=LeptonVisibility.PRIVATE) for n, v in sorted(secrets.items())]
    call("store the job's secrets", lambda: lepton.secret.create(items))


def delete_secrets(lepton: Any, names: Iterable[str]) -> list[str]:
    """Delete the named secrets; one already gone counts as deleted. Returns the names that could not be deleted."""
    import requests
    from leptonai.api.v2.api_resource import ClientError

    left = []
    for name in names:
        try:
            lepton.secret.delete(name)
        except ClientError as err:
            if err.response.status_code != 404:
                left.append(name)
        except (requests.RequestException, RuntimeError):
            left.append(name)
    return left


def get_job(lepton: Any, job_id: str) -> Any | None:
    """The job, or None when the workspace does not have it (any more)."""
    from leptonai.api.v2.api_resource import ClientError

    def read() -> Any | None:
        try:
            return lepton.job.get(job_id)
        except ClientError as err:
            if err.response.status_code == 404:
                return None
            raise

    return call(f"read job {job_id}", read)


def read_status(lepton: Any, job_id: str) -> tuple[JobStatus, bool]:
    """The job's status, and whether the workspace still has the job."""
    lepton_job = get_job(lepton, job_id)
    if lepton_job is None:
        return JobStatus(JobState.UNKNOWN, f"job {job_id} is not in workspace {lepton.workspace_id}"), False
    status = lepton_job.status
    phase = status.state.value if status and status.state else "no state yet"
    state = STATES.get(phase, JobState.UNKNOWN)
    if phase == "Archived":
        state = JobState.FAILED if status.failed else JobState.SUCCEEDED if status.succeeded else JobState.UNKNOWN
    counts = (
        f" ({status.ready or 0} ready, {status.succeeded or 0} succeeded, {status.failed or 0} failed)"
        if status
        else ""
    )
    return JobStatus(state, f"Lepton {phase}{counts}"), True


def first_replica(lepton: Any, job_id: str) -> str | None:
    """Rank 0's replica: ids read <job id>-<worker index>-<suffix>."""
    replicas = call(f"list replicas of {job_id}", lambda: lepton.job.get_replicas(job_id))
    ids = [r.metadata.id_ for r in replicas if r.metadata.id_]
    return next((r for r in ids if r.startswith(f"{job_id}-0-")), ids[0] if ids else None)


def recent_lines(lepton: Any, job_id: str, replica: str | None, since: float) -> Iterator[str]:
    """The last LOG_LINES lines of the job's stored log, oldest first."""
    now_ns, since_ns = time.time_ns(), int(since * 1e9)
    answer = call(
        f"read the log of {job_id}",
        lambda: lepton.log.get_log(
            name_or_job=job_id,
            replica=replica,
            start=str(since_ns),
            end=str(now_ns),
            limit=LOG_LINES,
            direction="backward",
        ),
    )
    entries = sorted(
        (int(ts), text) for stream in answer.get("data", {}).get("result", []) for ts, text, *_ in stream["values"]
    )
    if len(entries) >= LOG_LINES:
        yield f"[only the last {LOG_LINES} lines; follow the log to see it live]"
    for _, text in entries:
        yield text.rstrip("\n")


def stream(lepton: Any, job_id: str, replica: str) -> Iterator[str]:
    """A replica's live log, line by line, until the stream ends."""
    import requests

    try:
        yield from _lines(lepton.job.get_log(job_id, replica))
    except (requests.RequestException, RuntimeError) as err:
        raise RunFailed(f"the log stream of {job_id} stopped ({type(err).__name__})") from None


def _lines(chunks: Iterable[str]) -> Iterator[str]:
    """Text chunks from a log stream, regrouped into whole lines."""
    pending = ""
    for chunk in chunks:
        *whole, pending = (pending + chunk).split("\n")
        yield from whole
    if pending:
        yield pending
