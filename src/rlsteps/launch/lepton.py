"""Submit to DGX Cloud Lepton through the leptonai SDK's job API.

plan() builds the job from the SDK's own types (lepton_spec) and shows it as lepton_job.json; submit() posts
that file through APIClient().job.create (lepton_api) after what plan() cannot do offline: look up the node
group's id and store the secrets the job references.

The job's wheel of rlsteps (`code: ship`) is built into the job directory, as for Slurm, and travels in the
job's environment (RLSTEPS_CODE_*). lepton_job.json shows those chunks elided, with the wheel's sha256; submit()
puts them back from the job directory's wheel, checked against that sha256, so the spec posted carries them whole.

Each secret value rlsteps holds is stored under a name of its own job (lepton_spec.secret_name), listed in the
job's record, and deleted once rlsteps sees the job end or go (`rlsteps jobs list/status/cancel`, or the end of
an attached run); the record then notes it, so it is done once. A failure to delete is a warning.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlsteps.errors import RunFailed
from rlsteps.launch import code, lepton_server, server_alloc
from rlsteps.launch import lepton_api as api
from rlsteps.launch.base import JobRecord, JobState, JobStatus, LaunchPlan, Submission
from rlsteps.launch.job import Job
from rlsteps.launch.lepton_spec import (
    CONTAINER_JOBS_DIR,
    LeptonProfile,
    build_spec,
    held_secrets,
    is_secret_of,
    nemo_rl_files,
    secret_name,
    spec_body,
    summary,
)

SPEC_FILE = "lepton_job.json"
POLL_SECONDS = 10.0  # attached runs poll the job's state this often
SECRETS_DELETED = "secrets_deleted"  # record.extra: the job's own secrets are deleted
SERVER_JOB = "server_job"  # record.extra: the id of the run's server job (a profile's server:)
SERVER_DELETED = "server_deleted"  # record.extra: that job is deleted


class LeptonLauncher:
    name = "lepton"
    poll_seconds = POLL_SECONDS
    sees_local_files = False  # the container sees its mounts and remote URLs, nothing of this machine

    def __init__(self) -> None:
        self._released: set[str] = set()  # job ids whose secrets this process deleted

    def cluster_paths(self, job: Job) -> tuple[str, ...]:
        return tuple(str(m["mount_path"]) for m in LeptonProfile.of(job).mounts if m.get("mount_path"))

    def check(self, job: Job) -> None:
        """Refuse what cannot run, before anything is written or sent: a profile with an unknown key."""
        LeptonProfile.of(job)

    def processes(self, job: Job) -> tuple[int, int]:
        profile = LeptonProfile.of(job)
        return profile.nodes, profile.nprocs

    def plan(self, job: Job, job_dir: Path) -> LaunchPlan:
        """The job as the SDK will post it (its defaults filled in, validated) where the SDK is installed; without
        it, as rlsteps builds it, which a dry run shows and a submission (which needs the SDK) validates."""
        profile = LeptonProfile.of(job)
        if api.sdk_installed():
            api.require_sdk()
            body = build_spec(job, job_dir.name, profile).model_dump(by_alias=True, exclude_none=True, mode="json")
        else:
            body = spec_body(job, job_dir.name, profile)
        files = {}
        if profile.server:
            files[lepton_server.SERVER_SPEC_FILE] = json.dumps(_server_body(job, profile, body, job_dir.name), indent=2)
        _elide(body)
        plain = {e["name"]: e["value"] for e in body["spec"]["envs"] if "value" in e}
        return LaunchPlan(
            launcher=self.name,
            summary=summary(job, profile, body["metadata"]["id"], len([n for n in plain if code.is_chunk(n)]))
            + _server_note(profile, body["metadata"]["id"]),
            command=list(body["spec"]["container"]["command"]),
            env=plain,
            files={SPEC_FILE: json.dumps(body, indent=2)} | files | nemo_rl_files(job, job_dir.name, profile),
            code=code.wheel_name() if profile.code == "ship" else None,
        )

    def submit(self, job: Job, plan: LaunchPlan, job_dir: Path) -> Submission:
        self.check(job)
        api.require_sdk()
        from leptonai.api.v2.types.job import LeptonJob

        profile = LeptonProfile.of(job)
        client = api.client(profile.workspace)
        lepton_job = LeptonJob.model_validate(json.loads(plan.files[SPEC_FILE]))
        _carry_code(lepton_job, job_dir / plan.code if plan.code else None)
        lepton_job.spec.affinity.allowed_dedicated_node_groups = [api.node_group_id(client, profile.node_group)]
        job_id = lepton_job.metadata.id_
        secrets = {secret_name(job_id, k): v for k, v in held_secrets(job, profile).items()}
        api.create_secrets(client, secrets)
        server = _server_job(plan, job_dir, lepton_job)
        try:
            if server is not None:
                api.call("create the server's job", lambda: client.job.create(server))
            api.call("create the job", lambda: client.job.create(lepton_job))
        except RunFailed:
            if server is not None and api.get_job(client, server.metadata.id_) is not None:
                api.call(f"delete job {server.metadata.id_}", lambda: client.job.delete(server.metadata.id_))
            if secrets:
                _drop_unused_secrets(client, job_id, list(secrets))
            raise
        submission = Submission(job_id=job_id, job_dir=job_dir)
        if job.mode != "attached":
            return submission
        record = self.record(job, submission)
        record.save()  # visible to `rlsteps jobs` while it runs
        code = self._follow(client, record)
        return Submission(job_id=job_id, job_dir=job_dir, exit_code=code)

    def record(self, job: Job, submission: Submission) -> JobRecord:
        api.require_sdk()
        profile = LeptonProfile.of(job)
        job_id = submission.job_id
        extra = {
            "workspace": api.client(profile.workspace).workspace_id,
            "node_group": profile.node_group,
            "nodes": profile.nodes,
            "secrets": sorted(secret_name(job_id, k) for k in held_secrets(job, profile)),
            SECRETS_DELETED: job_id in self._released,
        }
        if profile.server:
            extra |= {SERVER_JOB: lepton_server.server_job_name(job_id), SERVER_DELETED: False}
        return JobRecord.of(self.name, job, submission, extra, datetime.now(UTC).isoformat(timespec="microseconds"))

    def status(self, record: JobRecord) -> JobStatus:
        client = api.client(record.extra.get("workspace"))
        status, present = api.read_status(client, record.job_id)
        if status.state.ended or not present:
            self._release_server(client, record)
            self._release_secrets(client, record)
        return status

    def logs(self, record: JobRecord, follow: bool = False) -> Iterator[str]:
        client = api.client(record.extra.get("workspace"))
        replica = api.first_replica(client, record.job_id)
        if follow:
            if replica is None:
                raise RunFailed(f"job {record.job_id} has no replica yet", fix="wait until it starts, then retry")
            yield from api.stream(client, record.job_id, replica)
            return
        since = datetime.fromisoformat(record.submitted).timestamp() - 60
        yield from api.recent_lines(client, record.job_id, replica, since)

    def cancel(self, record: JobRecord) -> None:
        """Delete the job (Lepton's cancel) and then its secrets; a job that is already gone is left as it is."""
        client = api.client(record.extra.get("workspace"))
        if api.get_job(client, record.job_id) is not None:
            api.call(f"delete job {record.job_id}", lambda: client.job.delete(record.job_id))
        self._release_server(client, record)
        self._release_secrets(client, record)

    def _follow(self, client: Any, record: JobRecord) -> int:
        """An attached run: stream rank 0's log once it starts, then wait for the end; 0 when it completed."""
        job_id = record.job_id
        streamed = False
        try:
            while True:
                state, present = api.read_status(client, job_id)
                if state.state.ended or not present:
                    break
                if not streamed and (replica := api.first_replica(client, job_id)) is not None:
                    streamed = True
                    try:
                        for line in api.stream(client, job_id, replica):
                            print(line)
                    except RunFailed as err:
                        print(f"{err}; waiting for the job to end", file=sys.stderr)
                time.sleep(self.poll_seconds)
        except KeyboardInterrupt:
            print(
                f"detached from Lepton job {job_id}: it keeps running (stop it with `rlsteps jobs cancel`)",
                file=sys.stderr,
            )
            return 130
        self._release_server(client, record)
        self._release_secrets(client, record)
        print(f"Lepton job {job_id}: {state.detail}", file=sys.stderr)
        return 0 if state.state is JobState.SUCCEEDED else 1

    def _release_server(self, client: Any, record: JobRecord) -> None:
        """Delete the server job of a run that has ended or is gone, once; the record notes it."""
        server = record.extra.get(SERVER_JOB)
        if not server or record.extra.get(SERVER_DELETED):
            return
        if api.get_job(client, server) is not None:
            api.call(f"delete the server's job {server}", lambda: client.job.delete(server))
        record.extra[SERVER_DELETED] = True
        try:
            record.save()
        except OSError as err:
            print(f"warning: cannot note in {record.job_dir} that its server job is deleted: {err}", file=sys.stderr)

    def _release_secrets(self, client: Any, record: JobRecord) -> None:
        """Delete the secrets of a job that has ended or is gone, once: the record notes it and is saved again.

        Only names of the job's own (secret_name) are deleted: older records list secrets shared between jobs.
        """
        names = [n for n in record.extra.get("secrets", []) if is_secret_of(record.job_id, n)]
        if not names or record.extra.get(SECRETS_DELETED):
            return
        left = api.delete_secrets(client, names)
        if left:  # tried again the next time the job is seen
            _warn_left(left, job_id=record.job_id, when="the next time it reads the job's status")
            return
        self._released.add(record.job_id)
        record.extra[SECRETS_DELETED] = True
        try:
            record.save()
        except OSError as err:
            print(f"warning: cannot note in {record.job_dir} that its secrets are deleted: {err}", file=sys.stderr)


LAUNCHER = LeptonLauncher()


def _server_note(profile: LeptonProfile, job_id: str) -> str:
    server = profile.server
    if server is None:
        return ""
    name = lepton_server.server_job_name(job_id)
    return (
        f"; {server.describe()} as job {name} ({lepton_server.SERVER_SPEC_FILE}), created first and deleted when "
        f"rlsteps sees the run end; the run reads {server_alloc.URL_KEYS[server.serves]} from {server.url_env}"
    )


def _elide(body: dict[str, Any]) -> None:
    """The wheel stays in the job dir: its chunks show elided, and submit puts them back."""
    for env in body["spec"]["envs"]:
        if "value" in env:
            env["value"] = code.elided(env["name"], env["value"])


def _server_body(job: Job, profile: LeptonProfile, run_body: dict[str, Any], job_dir_name: str) -> dict[str, Any]:
    """The server's job (lepton_server), checked by the SDK's own types where it is installed, its chunks elided."""
    shipped = {e["name"]: e["value"] for e in run_body["spec"]["envs"] if e["name"].startswith(code.ENV_PREFIX)}
    body = lepton_server.server_body(job, profile, run_body, shipped, f"{CONTAINER_JOBS_DIR}/{job_dir_name}")
    if api.sdk_installed():
        from leptonai.api.v2.types.job import LeptonJob

        body = LeptonJob.model_validate(body).model_dump(by_alias=True, exclude_none=True, mode="json")
    _elide(body)
    return body


def _server_job(plan: LaunchPlan, job_dir: Path, run_job: Any) -> Any | None:
    """The server's LeptonJob as it is posted: its code put back, in the run's node group."""
    if lepton_server.SERVER_SPEC_FILE not in plan.files:
        return None
    from leptonai.api.v2.types.job import LeptonJob

    server = LeptonJob.model_validate(json.loads(plan.files[lepton_server.SERVER_SPEC_FILE]))
    _carry_code(server, job_dir / plan.code if plan.code else None)
    server.spec.affinity.allowed_dedicated_node_groups = run_job.spec.affinity.allowed_dedicated_node_groups
    return server


def _carry_code(lepton_job: Any, wheel: Path | None) -> None:
    """The wheel's chunks in place of the spec file's elided values: the job dir's wheel (the same build again
    when the dir has none), refused unless it is the wheel planned."""
    envs = {e.name: e for e in lepton_job.spec.envs or []}
    planned = envs.get(f"{code.ENV_PREFIX}_SHA256")
    if wheel is None or planned is None:
        return
    content = wheel.read_bytes() if wheel.is_file() else code.build_wheel().content
    carried = code.env_chunks(content)
    if carried[planned.name] != planned.value:  # the same sha256: the same chunks, as many as planned
        raise RunFailed(
            f"the wheel of rlsteps for this job ({wheel}) is not the one planned (sha256 {planned.value})",
            fix="submit again: the job is planned with the code as it is now",
        )
    for name, value in carried.items():
        envs[name].value = value


def _drop_unused_secrets(client: Any, job_id: str, names: list[str]) -> None:
    """After a failed create: delete the job's secrets, unless the job exists after all (an answer lost)."""
    try:
        created = api.get_job(client, job_id) is not None
    except RunFailed:
        created = True  # not known: a job that did start needs them
    left = names if created else api.delete_secrets(client, names)
    if left:
        _warn_left(left, job_id=job_id, when=None)


def _warn_left(names: list[str], job_id: str, when: str | None) -> None:
    again = f"rlsteps tries again {when}, or " if when else ""
    print(
        f"warning: the secrets of Lepton job {job_id} are left in the workspace: {', '.join(names)}; "
        f"{again}delete them with `lep secret remove -n NAME`",
        file=sys.stderr,
    )
