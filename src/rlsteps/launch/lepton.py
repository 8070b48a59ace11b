"""Submit to DGX Cloud Lepton through the leptonai SDK's job API.

plan() builds the job from the SDK's own types (LeptonJob, LeptonJobUserSpec, LeptonContainer,
LeptonResourceAffinity, Mount, EnvVar) and shows it as lepton_job.json; submit() posts that file
through APIClient().job.create after what plan() cannot do offline: look up the node group's id
and store the secrets the job references.

The compiled config travels in the job's command, base64-encoded, and is decoded into a
container-local directory: nothing is copied to shared storage first, each replica gets its own
copy, and the config holds no secret values (secrets are `${oc.env:...}` interpolations).

Secrets: each value rlsteps holds (job.secret_env()) is stored as a private workspace secret named
after its variable, replaced at each submission; the job references it by name. A profile can also
reference an existing secret: `env_vars: {HF_TOKEN: {secret: NAME}}`. Credentials come from
`lep login` or LEPTON_WORKSPACE_ID / LEPTON_WORKSPACE_TOKEN and are never printed or written.
"""

from __future__ import annotations

import base64
import difflib
import json
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlsteps.errors import RunFailed, UsageError
from rlsteps.launch.base import JobRecord, JobState, JobStatus, LaunchPlan, Submission, worker_command
from rlsteps.launch.job import Job

SPEC_FILE = "lepton_job.json"
INSTALL_HINT = "pip install 'rlsteps[lepton]'"
LOGIN_HINT = "run `lep login`, or set LEPTON_WORKSPACE_ID and LEPTON_WORKSPACE_TOKEN"
CONTAINER_JOBS_DIR = "/tmp/rlsteps/jobs"  # container-local: each replica writes its own copy of the config
MAX_JOB_NAME = 36  # the SDK's limit for a job id
MASTER_PORT = 29400
LOG_LINES = 5000  # logs() without follow shows at most this many recent lines
POLL_SECONDS = 10.0  # attached runs poll the job's state this often

# Lepton's job states -> ours. Archived (finished and moved out of the live list) is decided by its counters.
STATES = {
    **dict.fromkeys(["Queueing", "Awaiting", "Starting", "PendingRetry", "Restarting"], JobState.PENDING),
    "Running": JobState.RUNNING,
    "Completed": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    **dict.fromkeys(["Stopping", "Stopped", "Terminating", "Deleting", "Deleted"], JobState.CANCELLED),
}

# Lepton sets these in every replica; the rank-0 replica's address is how the platform's own scripts find it.
RENDEZVOUS = """\
SERVICE_PREFIX="${LEPTON_JOB_SERVICE_PREFIX:-$LEPTON_JOB_NAME}"
SUBDOMAIN="${LEPTON_SUBDOMAIN:-$LEPTON_JOB_NAME-job-svc}"
MASTER_ADDR="$SERVICE_PREFIX-0.$SUBDOMAIN.ws-$LEPTON_WORKSPACE_ID.svc.cluster.local"
"""


class SecretRef(BaseModel):
    """An env_vars value that names a secret already stored in the workspace."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    secret: str


class LeptonProfile(BaseModel):
    """The profile keys this launcher reads; an unknown key is an error (a typo would be ignored otherwise)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    executor: str = "lepton"
    workspace: str | None = None  # a workspace id; default: LEPTON_WORKSPACE_ID or the `lep login` workspace
    node_group: str
    resource_shape: str
    container_image: str
    nodes: int = Field(1, ge=1)
    gpus_per_node: int | None = Field(None, ge=1)
    nprocs_per_node: int | None = Field(None, ge=1)  # processes per node; default gpus_per_node, else 1
    mounts: list[dict[str, Any]] = []
    env_vars: dict[str, str | int | float | bool | SecretRef] = {}
    image_pull_secrets: list[str] = []
    shared_memory_size: int | None = Field(None, ge=0)  # MiB
    node_reservation: str | None = None
    pre_launch_commands: list[str] = []  # shell lines run before the worker, as written
    workdir: str | None = None  # where relative output paths land; default the first mount

    @classmethod
    def of(cls, job: Job) -> LeptonProfile:
        where = f"profile {job.profile_name or '?'} ({job.profile_source or 'no file'})"
        try:
            profile = cls.model_validate(job.launcher_settings)
        except ValidationError as err:
            raise UsageError(
                f"{where}: {_describe(err)}", fix=f"the Lepton keys are: {', '.join(cls.model_fields)}"
            ) from None
        if profile.workspace and ":" in profile.workspace:
            raise UsageError(
                f"{where}: `workspace` holds a credential (ID:TOKEN)", fix=f"keep only the id; {LOGIN_HINT}"
            )
        return profile

    @property
    def nprocs(self) -> int:
        return self.nprocs_per_node or self.gpus_per_node or 1

    @property
    def run_dir(self) -> str | None:
        return self.workdir or (self.mounts[0].get("mount_path") if self.mounts else None)

    def secret_refs(self) -> dict[str, str]:
        return {k: v.secret for k, v in self.env_vars.items() if isinstance(v, SecretRef)}

    def plain_env(self, held: dict[str, str]) -> dict[str, str]:
        plain = {
            k: str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in self.env_vars.items()
            if not isinstance(v, SecretRef) and k not in held
        }
        return {"PYTHONUNBUFFERED": "1", **plain}


def held_secrets(job: Job, profile: LeptonProfile) -> dict[str, str]:
    """Env var -> value of every secret rlsteps itself holds (config secrets, secret-looking env_vars)."""
    refs = profile.secret_refs()
    return {name: value for name, value in job.secret_env().items() if name not in refs}


def secret_name(env_var: str) -> str:
    """The workspace secret that carries a held value; config secrets already have an RLSTEPS_SECRET_ name."""
    return env_var if env_var.startswith("RLSTEPS_SECRET_") else f"RLSTEPS_ENV_{env_var}"


def lepton_job_name(job_dir_name: str) -> str:
    """A Lepton job id: lowercase letters, digits and '-', a letter first, at most 36 characters."""
    text = re.sub(r"[^a-z0-9]+", "-", job_dir_name.lower()).strip("-")
    name = text if text[:1].isalpha() else f"j-{text}"
    return name[:MAX_JOB_NAME].rstrip("-")


def entry_script(job: Job, job_dir_name: str, profile: LeptonProfile) -> str:
    """The container's bash script: write the config, run the profile's setup, start the worker."""
    config_dir = f"{CONTAINER_JOBS_DIR}/{job_dir_name}"
    record = {
        "job": {
            "name": job_dir_name,
            "step": job.step_id,
            "config": job.config_name,
            "mode": job.mode,
            "created": job.created,
            "launcher": "lepton",
        }
    }
    lines = [
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(config_dir)}",
        _decode_into(f"{config_dir}/config.yaml", job.worker_config()),
        _decode_into(f"{config_dir}/job.yaml", record),
        *profile.pre_launch_commands,
    ]
    if profile.run_dir:
        lines.append(f"mkdir -p {shlex.quote(profile.run_dir)} && cd {shlex.quote(profile.run_dir)}")
    worker = worker_command("python", Path(config_dir), job.passthrough)  # python -m rlsteps.engine.worker CONFIG ...
    if profile.nodes == 1 and profile.nprocs == 1:
        lines.append(f"exec {shlex.join(worker)}")
    elif profile.nodes == 1:
        lines.append(
            f"exec {shlex.join(['torchrun', '--standalone', f'--nproc-per-node={profile.nprocs}', *worker[1:]])}"
        )
    else:
        lines.append(RENDEZVOUS.rstrip())
        torchrun = [
            "torchrun",
            f"--nnodes={profile.nodes}",
            f"--nproc-per-node={profile.nprocs}",
            f"--master-port={MASTER_PORT}",
        ]
        lines.append(
            f'exec {shlex.join(torchrun)} --node-rank="$LEPTON_JOB_WORKER_INDEX" --master-addr="$MASTER_ADDR" '
            f"{shlex.join(worker[1:])}"
        )
    return "\n".join(lines) + "\n"


def build_spec(job: Job, job_dir_name: str, profile: LeptonProfile) -> Any:
    """The LeptonJob to post; the node group appears by name until submit() swaps in its id."""
    from leptonai.api.v2.job_validation import validate_job_create
    from leptonai.api.v2.types.affinity import LeptonResourceAffinity
    from leptonai.api.v2.types.common import LeptonVisibility, Metadata
    from leptonai.api.v2.types.deployment import EnvValue, EnvVar, LeptonContainer, Mount, ReservationConfig
    from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

    held = held_secrets(job, profile)
    references = {**{k: secret_name(k) for k in held}, **profile.secret_refs()}
    envs = [EnvVar(name=k, value=v) for k, v in profile.plain_env(held).items()]
    envs += [EnvVar(name=k, value_from=EnvValue(secret_name_ref=ref)) for k, ref in sorted(references.items())]
    name = lepton_job_name(job_dir_name)
    try:
        spec = LeptonJobUserSpec(
            resource_shape=profile.resource_shape,
            affinity=LeptonResourceAffinity(allowed_dedicated_node_groups=[profile.node_group]),
            container=LeptonContainer(
                image=profile.container_image, command=["/bin/bash", "-c", entry_script(job, job_dir_name, profile)]
            ),
            completions=profile.nodes,
            parallelism=profile.nodes,
            intra_job_communication=True if profile.nodes > 1 else None,
            shared_memory_size=profile.shared_memory_size,
            envs=envs,
            mounts=[Mount.model_validate(m) for m in profile.mounts],
            image_pull_secrets=profile.image_pull_secrets,
            reservation_config=ReservationConfig(reservation_id=profile.node_reservation)
            if profile.node_reservation
            else None,
        )
        lepton_job = LeptonJob(
            metadata=Metadata(
                id=name,
                name=name,
                visibility=LeptonVisibility.PRIVATE,
                labels={"rlsteps-step": lepton_job_name(job.step_id)},
            ),
            spec=spec,
        )
        validate_job_create(lepton_job)
    except ValidationError as err:
        raise UsageError(
            f"profile {job.profile_name}: {_describe(err)}", fix="each mount needs path, mount_path and from"
        ) from None
    except ValueError as err:
        raise UsageError(f"profile {job.profile_name}: {err}") from None
    return lepton_job


class LeptonLauncher:
    name = "lepton"
    poll_seconds = POLL_SECONDS

    def plan(self, job: Job, job_dir: Path) -> LaunchPlan:
        _require_sdk()
        profile = LeptonProfile.of(job)
        lepton_job = build_spec(job, job_dir.name, profile)
        body = lepton_job.model_dump(by_alias=True, exclude_none=True, mode="json")  # as the SDK's job API sends it
        return LaunchPlan(
            launcher=self.name,
            summary=_summary(job, profile, lepton_job.metadata.id_),
            command=list(lepton_job.spec.container.command),
            env=profile.plain_env(held_secrets(job, profile)),
            files={SPEC_FILE: json.dumps(body, indent=2)},
        )

    def submit(self, job: Job, plan: LaunchPlan, job_dir: Path) -> Submission:
        _require_sdk()
        from leptonai.api.v2.types.job import LeptonJob

        profile = LeptonProfile.of(job)
        client = _client(profile.workspace)
        lepton_job = LeptonJob.model_validate(json.loads(plan.files[SPEC_FILE]))
        lepton_job.spec.affinity.allowed_dedicated_node_groups = [_node_group_id(client, profile.node_group)]
        held = held_secrets(job, profile)
        _api("store the job's secrets", lambda: _store_secrets(client, {secret_name(k): v for k, v in held.items()}))
        created = _api("create the job", lambda: client.job.create(lepton_job))
        job_id = created.metadata.id_ or lepton_job.metadata.id_
        if job.mode != "attached":
            return Submission(job_id=job_id, job_dir=job_dir)
        return Submission(job_id=job_id, job_dir=job_dir, exit_code=self._follow(client, job_id))

    def record(self, job: Job, submission: Submission) -> JobRecord:
        _require_sdk()
        profile = LeptonProfile.of(job)
        extra = {
            "workspace": _client(profile.workspace).workspace_id,
            "node_group": profile.node_group,
            "nodes": profile.nodes,
            "secrets": sorted(secret_name(k) for k in held_secrets(job, profile)),
        }
        return JobRecord.of(self.name, job, submission, extra, datetime.now(UTC).isoformat(timespec="seconds"))

    def status(self, record: JobRecord) -> JobStatus:
        _require_sdk()
        return _status(_client(record.extra.get("workspace")), record.job_id)

    def logs(self, record: JobRecord, follow: bool = False) -> Iterator[str]:
        _require_sdk()
        client = _client(record.extra.get("workspace"))
        replica = _first_replica(client, record.job_id)
        if follow:
            if replica is None:
                raise RunFailed(f"job {record.job_id} has no replica yet", fix="wait until it starts, then retry")
            yield from _stream(client, record.job_id, replica)
            return
        since = datetime.fromisoformat(record.submitted).timestamp() - 60
        yield from _recent_lines(client, record.job_id, replica, since)

    def cancel(self, record: JobRecord) -> None:
        """Delete the job (Lepton's cancel); a job that is already gone is left as it is."""
        _require_sdk()
        client = _client(record.extra.get("workspace"))
        if _api(f"read job {record.job_id}", lambda: _get_job(client, record.job_id)) is not None:
            _api(f"delete job {record.job_id}", lambda: client.job.delete(record.job_id))

    def _follow(self, client: Any, job_id: str) -> int:
        """An attached run: stream rank 0's log once it starts, then wait for the end; 0 when it completed."""
        streamed = False
        try:
            while not (state := _status(client, job_id)).state.ended:
                if not streamed and (replica := _first_replica(client, job_id)) is not None:
                    streamed = True
                    try:
                        for line in _stream(client, job_id, replica):
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
        print(f"Lepton job {job_id}: {state.detail}", file=sys.stderr)
        return 0 if state.state is JobState.SUCCEEDED else 1


LAUNCHER = LeptonLauncher()


def _require_sdk() -> None:
    try:
        import leptonai.api.v2.types.job  # noqa: F401  (the v2 job types came with leptonai 0.47)
    except ImportError as err:
        raise UsageError(
            f"the Lepton launcher needs the leptonai SDK, 0.47 or later ({err})", fix=INSTALL_HINT
        ) from None


def _client(workspace: str | None) -> Any:
    from leptonai.api.v2.client import APIClient
    from leptonai.api.v2.utils import WorkspaceConfigurationError

    try:
        return APIClient(workspace_id=workspace)
    except WorkspaceConfigurationError:
        raise UsageError("no DGX Cloud Lepton workspace to talk to", fix=LOGIN_HINT) from None


T = TypeVar("T")


def _api(what: str, call: Callable[[], T]) -> T:
    """One SDK call; its failure becomes a one-line error (the SDK redacts credentials from response text)."""
    import requests

    try:
        return call()
    except requests.RequestException as err:
        raise RunFailed(f"cannot reach the Lepton API to {what}: {type(err).__name__}", fix=LOGIN_HINT) from None
    except RuntimeError as err:  # the SDK's ClientError / ServerError
        refused = getattr(getattr(err, "response", None), "status_code", None) in (401, 403)
        raise RunFailed(
            f"Lepton API: could not {what}: {str(err).splitlines()[0]}", fix=LOGIN_HINT if refused else None
        ) from None


def _node_group_id(client: Any, name: str) -> str:
    groups = _api("list node groups", client.nodegroup.list_all)
    for group in groups:
        if name in (group.metadata.name, group.metadata.id_):
            return group.metadata.id_
    known = ", ".join(g.metadata.name or g.metadata.id_ for g in groups) or "none"
    raise UsageError(
        f"node group '{name}' is not in workspace {client.workspace_id}", fix=f"set node_group to one of: {known}"
    )


def _store_secrets(client: Any, secrets: dict[str, str]) -> None:
    """Store each value as a private workspace secret, replacing an older one (the store has no update)."""
    if not secrets:
        return
    from leptonai.api.v2.types.common import LeptonVisibility
    from leptonai.api.v2.types.secret import SecretItem

    existing = {item.name for item in client.secret.list_all()}
    for name in sorted(existing & secrets.keys()):
        client.secret.delete(name)
    client.secret.create([SecretItem(name=n, value=v, visibility=LeptonVisibility.PRIVATE) for n, v in secrets.items()])


def _get_job(client: Any, job_id: str) -> Any | None:
    from leptonai.api.v2.api_resource import ClientError

    try:
        return client.job.get(job_id)
    except ClientError as err:
        if err.response.status_code == 404:
            return None
        raise


def _status(client: Any, job_id: str) -> JobStatus:
    lepton_job = _api(f"read job {job_id}", lambda: _get_job(client, job_id))
    if lepton_job is None:
        return JobStatus(JobState.UNKNOWN, f"job {job_id} is not in workspace {client.workspace_id}")
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
    return JobStatus(state, f"Lepton {phase}{counts}")


def _first_replica(client: Any, job_id: str) -> str | None:
    """Rank 0's replica: ids read <job id>-<worker index>-<suffix>."""
    replicas = _api(f"list replicas of {job_id}", lambda: client.job.get_replicas(job_id))
    ids = [r.metadata.id_ for r in replicas if r.metadata.id_]
    return next((r for r in ids if r.startswith(f"{job_id}-0-")), ids[0] if ids else None)


def _recent_lines(client: Any, job_id: str, replica: str | None, since: float) -> Iterator[str]:
    """The last LOG_LINES lines of the job's stored log, oldest first."""
    now_ns, since_ns = time.time_ns(), int(since * 1e9)
    answer = _api(
        f"read the log of {job_id}",
        lambda: client.log.get_log(
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


def _lines(chunks: Iterable[str]) -> Iterator[str]:
    """Text chunks from a log stream, regrouped into whole lines."""
    pending = ""
    for chunk in chunks:
        *whole, pending = (pending + chunk).split("\n")
        yield from whole
    if pending:
        yield pending


def _stream(client: Any, job_id: str, replica: str) -> Iterator[str]:
    """A replica's live log, line by line, until the stream ends."""
    import requests

    try:
        yield from _lines(client.job.get_log(job_id, replica))
    except (requests.RequestException, RuntimeError) as err:
        raise RunFailed(f"the log stream of {job_id} stopped ({type(err).__name__})") from None


def _summary(job: Job, profile: LeptonProfile, job_id: str) -> str:
    where = f"workspace {profile.workspace}" if profile.workspace else "the logged-in workspace"
    outputs = (
        f"relative outputs under {profile.run_dir}"
        if profile.run_dir
        else "no mount: outputs are lost when the job ends"
    )
    how = (
        "attached: streams the log until it ends"
        if job.mode == "attached"
        else "detached: follow it with `rlsteps jobs logs -f`"
    )
    return (
        f"submit {job.step_id} to DGX Cloud Lepton ({where}) as job {job_id}: "
        f"{profile.nodes} x {profile.resource_shape} in "
        f"node group {profile.node_group} (id looked up at submission), {profile.container_image}; {outputs}; {how}"
    )


def _decode_into(path: str, data: dict[str, Any]) -> str:
    """A shell line that writes data as YAML to path; base64 needs no quoting and survives any content."""
    encoded = base64.b64encode(OmegaConf.to_yaml(OmegaConf.create(data)).encode()).decode()
    return f"echo {encoded} | base64 -d > {shlex.quote(path)}"


def _describe(err: ValidationError) -> str:
    problems = []
    for e in err.errors(include_url=False, include_input=False):
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(e["loc"][-1]), list(LeptonProfile.model_fields), n=1)
            problems.append(f"unknown key '{key}'" + (f" (did you mean {close[0]}?)" if close else ""))
        else:
            problems.append(f"{key}: {e['msg']}")
    return "; ".join(problems)
