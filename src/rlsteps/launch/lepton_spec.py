"""The Lepton job a profile describes, built offline from the leptonai SDK's own types.

The profile model (LeptonProfile), the container's entry script and the LeptonJob to post; nothing here talks to
the API. The compiled config travels in the job's command, base64-encoded, and is decoded into a container-local
directory: nothing is copied to shared storage first, each replica gets its own copy, and the config holds no
secret values (secrets are `${oc.env:...}` interpolations).

Code (`code: ship`, the default): the job's own wheel of rlsteps travels in the job's environment, base64 in
chunks (code.env_chunks: the SDK uploads no file, and one environment string is capped at 128 KiB); the entry
script rebuilds it next to the config, checks its sha256 and puts it first on PYTHONPATH, so a stock image runs
the code that compiled the job. `code: installed` sends none: the image's own rlsteps runs.

Secrets: each value rlsteps holds (job.secret_env()) is stored as a private workspace secret of its own job,
named after the job id and the variable (secret_name), and the job references it by name. A profile can also
reference an existing secret: `env_vars: {HF_TOKEN: {secret: NAME}}`.
"""

from __future__ import annotations

import base64
import difflib
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlsteps.contract.run_files import run_directory
from rlsteps.errors import UsageError
from rlsteps.launch import code, ray_job, server_alloc
from rlsteps.launch.base import worker_command
from rlsteps.launch.job import Job
from rlsteps.launch.lepton_server import LeptonServer, server_job_name, wait_lines

LOGIN_HINT = "run `lep login`, or set LEPTON_WORKSPACE_ID and LEPTON_WORKSPACE_TOKEN"
CONTAINER_JOBS_DIR = "/tmp/rlsteps/jobs"  # container-local: each replica writes its own copy of the config
MAX_JOB_NAME = 36  # the SDK's limit for a job id
MASTER_PORT = 29400
SECRET_PREFIX = "rlsteps_"  # a secret name may not start with LEPTON_; this one says whose it is
MAX_EXEC = 1024 * 1024  # the command and environment together: half of Linux's usual 2 MiB, half left to the platform

# Lepton sets LEPTON_JOB_SERVICE_PREFIX, LEPTON_SUBDOMAIN, LEPTON_JOB_NAME and LEPTON_JOB_WORKER_INDEX in every
# replica (DGX Cloud Lepton's batch job environment variable reference); replica i answers at
# PREFIX-i.SUBDOMAIN, which is how the platform's own multi-node examples address replica 0.
RENDEZVOUS = """\
SERVICE_PREFIX="${LEPTON_JOB_SERVICE_PREFIX:-$LEPTON_JOB_NAME}"
SUBDOMAIN="${LEPTON_SUBDOMAIN:-$LEPTON_JOB_NAME-job-svc}"
MASTER_ADDR="$SERVICE_PREFIX-0.$SUBDOMAIN"
"""
LEPTON_TRY = '"${LEPTON_JOB_NAME:-job}-${LEPTON_JOB_FAILURE_COUNT:-0}"'  # one try of the job: a retry has its own


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
    gpu_memory_gib: float | None = Field(None, gt=0)  # each GPU's memory: NeMo-RL jobs are checked against it
    nprocs_per_node: int | None = Field(None, ge=1)  # processes per node; default gpus_per_node, else 1
    mounts: list[dict[str, Any]] = []
    env_vars: dict[str, str | int | float | bool | SecretRef] = {}
    image_pull_secrets: list[str] = []
    shared_memory_size: int | None = Field(None, ge=0)  # MiB
    node_reservation: str | None = None
    pre_launch_commands: list[str] = []  # shell lines run before the worker, as written
    workdir: str | None = None  # where relative output paths land; default the first mount
    code: Literal["ship", "installed"] = "ship"  # ship: the job runs its own wheel of rlsteps; installed: image has it
    server: LeptonServer | None = None  # the reward model or judge server as a job of its own (lepton_server)

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
    def world_size(self) -> int:
        return self.nodes * self.nprocs

    @property
    def working_dir(self) -> str | None:
        """Where the job starts on Lepton, and a relative output.dir lies: the profile's workdir, else its first
        mount."""
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


def secret_name(job_id: str, env_var: str) -> str:
    """The workspace secret that carries one held value of one job.

    Unique per job, so no submission replaces or deletes another job's value. Lepton's rules for a secret name
    (the SDK's validate_environment_variable_name): letters, digits, '.', '_' and '-', not a digit first, not a
    LEPTON_ name. A job id is [a-z][a-z0-9-]* and has no '_', so the first '_' after the prefix ends it.
    """
    return f"{SECRET_PREFIX}{job_id}_{env_var}"


def is_secret_of(job_id: str, name: str) -> bool:
    """Whether a recorded secret name is this job's own (older records named shared secrets, never deleted)."""
    return name.startswith(f"{SECRET_PREFIX}{job_id}_")


def lepton_job_name(job_dir_name: str) -> str:
    """A Lepton job id: lowercase letters, digits and '-', a letter first, at most 36 characters."""
    text = re.sub(r"[^a-z0-9]+", "-", job_dir_name.lower()).strip("-")
    name = text if text[:1].isalpha() else f"j-{text}"
    return name[:MAX_JOB_NAME].rstrip("-")


def shipped_code(profile: LeptonProfile) -> dict[str, str]:
    """The environment that carries the job's wheel of rlsteps (code.env_chunks), or none with `code: installed`."""
    return code.env_chunks(code.build_wheel().content) if profile.code == "ship" else {}


def entry_script(job: Job, job_dir_name: str, profile: LeptonProfile, shipped: dict[str, str] | None = None) -> str:
    """The container's bash script: write the config, rebuild the shipped wheel, run the profile's setup, start
    the worker; with more than one process, a torchrun of it: alone (--standalone) on one node, else meeting the
    other replicas at replica 0 (RENDEZVOUS), this replica's node rank its worker index."""
    config_dir = f"{CONTAINER_JOBS_DIR}/{job_dir_name}"
    record = {
        "job": {
            "name": job_dir_name,
            "step": job.step_id,
            "config": job.config_name,
            "mode": job.mode,
            "created": job.created,
            "launcher": "lepton",
        },
        "inputs_in_job": job.inputs_in_job,  # on the mounts: the worker checks these before it starts
    }
    lines = [
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(config_dir)}",
        _decode_into(f"{config_dir}/config.yaml", worker_config(job, profile)),
        _decode_into(f"{config_dir}/job.yaml", record),
        *(code.unpack_lines(f"{config_dir}/{code.wheel_name()}", shipped) if shipped else []),
        *profile.pre_launch_commands,
    ]
    if profile.working_dir:
        lines.append(f"mkdir -p {shlex.quote(profile.working_dir)} && cd {shlex.quote(profile.working_dir)}")
    if ray_job.uses_nemo_rl(job):
        return "\n".join(lines + _ray_node_lines(job, profile, config_dir)) + "\n"
    if profile.server:
        lines += wait_lines(profile.server, server_job_name(lepton_job_name(job_dir_name)))
    # python -m rlsteps.engine.run.worker CONFIG ...
    worker = worker_command("python", Path(config_dir), job.passthrough)
    if profile.world_size == 1:
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


def worker_config(job: Job, profile: LeptonProfile) -> dict[str, Any]:
    """The config the worker reads: with a server job, the served section's URL from the variable the script sets."""
    if profile.server:
        server_alloc.check(job, profile.server)
        return server_alloc.worker_config(job, profile.server)
    return job.worker_config()


def ray_job_of(job: Job, profile: LeptonProfile, config_dir: str) -> ray_job.RayJob:
    """engine=nemo_rl: every replica is one node of the Ray job; their shared state lives on the mount."""
    if not profile.working_dir:
        raise UsageError(
            "engine=nemo_rl on Lepton needs a shared mount: the nodes meet through files under the run directory",
            fix="add a mount to the profile (or set workdir to a folder on one)",
        )
    ray = ray_job.RayJob(
        nodes=profile.nodes,
        gpus_per_node=profile.gpus_per_node or 0,
        gpu_memory_gib=profile.gpu_memory_gib,
        job_dir=PurePosixPath(config_dir),
        run_dir=run_directory(job.config, profile.working_dir),
        python="python",
    )
    mounts = ray_job.shared_folders(m["mount_path"] for m in profile.mounts if m.get("mount_path"))
    ray_job.require_shared(
        ray, mounts, fix=f"set output.dir to a folder under a mount's mount_path ({', '.join(map(str, mounts))})"
    )
    return ray


def nemo_rl_files(job: Job, job_dir_name: str, profile: LeptonProfile) -> dict[str, str]:
    """The NeMo-RL files each replica writes for itself (the dry run shows them as they are); none for the
    embedded engine."""
    if not ray_job.uses_nemo_rl(job):
        return {}
    return ray_job.job_files(job, ray_job_of(job, profile, f"{CONTAINER_JOBS_DIR}/{job_dir_name}"))


def _ray_node_lines(job: Job, profile: LeptonProfile, config_dir: str) -> list[str]:
    """Write the master config and the node script into the replica, then run this replica's part of the Ray job
    (its node rank: LEPTON_JOB_WORKER_INDEX). The try: the job's name and LEPTON_JOB_FAILURE_COUNT (the job's
    failed attempts so far, the same in every replica of a try); replica 0 names the try's attempt and publishes it
    on the mount (rlsteps.launch.ray_job)."""
    ray = ray_job_of(job, profile, config_dir)
    files = ray_job.job_files(job, ray)
    lines = [_text_into(f"{config_dir}/{name}", content) for name, content in files.items()]
    node = ray_job.published_node_command(ray, "TRY")[:-1]
    return [*lines, f"exec {shlex.join(node)} {LEPTON_TRY}"]


def spec_body(job: Job, job_dir_name: str, profile: LeptonProfile) -> dict[str, Any]:
    """The LeptonJob to post, as the JSON the job API takes, built without the SDK (a dry run needs none); the node
    group appears by name until submission swaps in its id. build_spec validates it with the SDK's own types."""
    name = lepton_job_name(job_dir_name)
    held = held_secrets(job, profile)
    references = {**{k: secret_name(name, k) for k in held}, **profile.secret_refs()}
    shipped = shipped_code(profile)
    plain = profile.plain_env(held) | shipped
    script = entry_script(job, job_dir_name, profile, shipped)
    _check_size(job, script, plain)
    envs = [{"name": k, "value": v} for k, v in plain.items()]
    envs += [{"name": k, "value_from": {"secret_name_ref": ref}} for k, ref in sorted(references.items())]
    spec: dict[str, Any] = {
        "resource_shape": profile.resource_shape,
        "affinity": {"allowed_dedicated_node_groups": [profile.node_group]},
        "container": {"image": profile.container_image, "command": ["/bin/bash", "-c", script]},
        "completions": profile.nodes,
        "parallelism": profile.nodes,
        "intra_job_communication": True if profile.nodes > 1 else None,
        "shared_memory_size": profile.shared_memory_size,
        "envs": envs,
        "mounts": [dict(m) for m in profile.mounts],
        "image_pull_secrets": list(profile.image_pull_secrets),
        "reservation_config": {"reservation_id": profile.node_reservation} if profile.node_reservation else None,
    }
    metadata = {
        "id": name,
        "name": name,
        "visibility": "private",
        "labels": {"rlsteps-step": lepton_job_name(job.step_id)},
    }
    return {"metadata": metadata, "spec": {k: v for k, v in spec.items() if v is not None}}


def build_spec(job: Job, job_dir_name: str, profile: LeptonProfile) -> Any:
    """spec_body as the SDK's LeptonJob, validated as the SDK validates a job it creates."""
    from leptonai.api.v2.job_validation import validate_job_create
    from leptonai.api.v2.types.job import LeptonJob

    body = spec_body(job, job_dir_name, profile)
    try:
        lepton_job = LeptonJob.model_validate(body)
        validate_job_create(lepton_job)
    except ValidationError as err:
        raise UsageError(
            f"profile {job.profile_name}: {_describe(err)}", fix="each mount needs path, mount_path and from"
        ) from None
    except ValueError as err:
        raise UsageError(f"profile {job.profile_name}: {err}") from None
    return lepton_job


def summary(job: Job, profile: LeptonProfile, job_id: str, chunks: int) -> str:
    where = f"workspace {profile.workspace}" if profile.workspace else "the logged-in workspace"
    outputs = (
        f"relative outputs under {profile.working_dir}"
        if profile.working_dir
        else "no mount: outputs are lost when the job ends"
    )
    how = (
        "attached: streams the log until it ends"
        if job.mode == "attached"
        else "detached: follow it with `rlsteps jobs logs -f`"
    )
    text = (
        f"submit {job.step_id} to DGX Cloud Lepton ({where}) as job {job_id}: "
        f"{profile.nodes} x {profile.resource_shape}, {profile.nprocs} process(es) per node, in "
        f"node group {profile.node_group} (id looked up at submission), {profile.container_image}; {outputs}; {how}; "
        + (
            f"code: the job's own wheel of rlsteps, first on PYTHONPATH ({code.wheel_name()}, carried in the job's "
            f"environment as {chunks} chunks)"
            if profile.code == "ship"
            else "code: rlsteps as installed in the image (code: installed)"
        )
    )
    return text


def _check_size(job: Job, script: str, env: dict[str, str]) -> None:
    """Refuse a command or environment that Linux would not start the container's program with (execve: E2BIG)."""
    strings = [script, *(f"{k}={v}" for k, v in env.items())]
    sizes = [len(s.encode()) + 1 for s in strings]  # each with its terminating NUL
    if max(sizes) > code.ARG_STRLEN or sum(sizes) > MAX_EXEC:
        raise UsageError(
            f"profile {job.profile_name}: the job's command and environment take {sum(sizes) / 1024:.0f} KiB, their "
            f"longest string {max(sizes) / 1024:.0f} KiB: more than a container is sure to start with (Linux takes "
            f"{code.ARG_STRLEN // 1024} KiB a string; rlsteps keeps the whole under {MAX_EXEC // 1024} KiB)",
            fix="make the config smaller (it travels in the command), or set code: installed with rlsteps in the image",
        )


def _decode_into(path: str, data: dict[str, Any]) -> str:
    """A shell line that writes data as YAML to path."""
    return _text_into(path, OmegaConf.to_yaml(OmegaConf.create(data)))


def _text_into(path: str, text: str) -> str:
    """A shell line that writes text to path; base64 needs no quoting and survives any content."""
    encoded = base64.b64encode(text.encode()).decode()
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
