"""A reward model or judge server on an allocation of its own: the profile's `server:` mapping, the server's command,
and how the run's worker finds it.

The run's worker reads the served section's URL (rm.url or judge.url) from its config.yaml, where the launcher writes
it as `${oc.env:RLSTEPS_RM_URL}` (or RLSTEPS_JUDGE_URL): the job exports that variable once it knows where the
server runs, and the worker's config resolves it when it is read. The compiled config itself leaves the URL unset,
as for a server the run starts itself, or names that same interpolation (rm.api=vllm|triton need a URL to compile).

Server kinds:
  - rlsteps: `python -m rlsteps.engine.rewards.rm|judge` (`rlsteps serve rm|judge`), with the run's own model input
    and the options the run would start its own server with;
  - vllm: vLLM's OpenAI-compatible server: its pooling runner for a reward model (rm.api=vllm), its chat API for a
    judge;
  - triton: a NeMo-Aligner-style PyTriton reward server (rm.api=triton), whose command the profile gives.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlsteps.contract.entry_points import SERVER_MODULES
from rlsteps.errors import UsageError
from rlsteps.launch import ray_job
from rlsteps.launch.job import Job
from rlsteps.secrets import env_name

URL_KEYS = {"rm": "rm.url", "judge": "judge.url"}
URL_ENV = {"rm": "RLSTEPS_RM_URL", "judge": "RLSTEPS_JUDGE_URL"}
MODEL_INPUTS = {"rm": "reward_model", "judge": "judge_model"}
SECRET_KEYS = {"rm": "rm.token", "judge": "judge.api_key"}
HEALTH_PATHS = {"rlsteps": "/health", "vllm": "/health", "triton": "/v2/health/ready"}
DEFAULT_PORTS = {"rlsteps": 5555, "vllm": 8000, "triton": 5555}
RM_APIS = {"rlsteps": "rlsteps", "vllm": "vllm", "triton": "triton"}  # the server kind -> the rm.api that speaks it
VLLM_SERVER = "vllm.entrypoints.openai.api_server"


class ServerAllocation(BaseModel):
    """A profile's `server:` mapping: the reward model or judge server on nodes of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    serves: Literal["rm", "judge"] = "rm"  # the config section whose URL the server fills
    kind: Literal["rlsteps", "vllm", "triton"] = "rlsteps"
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | int | None = None
    container_image: str | None = None  # default: the run's own image (none: the nodes' environment)
    python: str | None = None  # the server's python; default the run's
    port: int | None = Field(None, ge=1, le=65535)  # default 5555 (rlsteps, triton) or 8000 (vllm)
    model: str | None = None  # what it serves; default the run's input (inputs.reward_model or inputs.judge_model)
    command: list[str] = []  # triton: the server's command (NeMo-Aligner's serve_reward_model.py and its overrides)
    args: list[str] = []  # more arguments for the server, appended as given
    ready_timeout_s: int = Field(1800, ge=10)  # the run stops if the server is not answering by then

    @model_validator(mode="after")
    def _triton_names_its_command(self) -> ServerAllocation:
        if self.kind == "triton" and not self.command:
            raise ValueError(
                "kind triton needs command: the server's command line, e.g. [python, "
                "/opt/NeMo-Aligner/examples/nlp/gpt/serve_reward_model.py, rm_model_file=/models/rm.nemo]"
            )
        if self.kind != "triton" and self.command:
            raise ValueError(f"command is for kind triton; kind {self.kind} builds its own (add options with args)")
        if self.kind == "triton" and self.serves == "judge":
            raise ValueError("kind triton serves a reward model (serves: rm); a judge is kind rlsteps or vllm")
        return self

    @property
    def listen_port(self) -> int:
        return self.port or DEFAULT_PORTS[self.kind]

    @property
    def url_env(self) -> str:
        return URL_ENV[self.serves]

    @property
    def health_path(self) -> str:
        return HEALTH_PATHS[self.kind]

    @property
    def url_suffix(self) -> str:
        """What follows host:port in the worker's URL: a judge's client takes the OpenAI API's base (/v1)."""
        return "/v1" if self.serves == "judge" else ""

    def describe(self) -> str:
        return f"the {'reward model' if self.serves == 'rm' else 'judge'} server ({self.kind})"


def _section(job: Job, serves: str) -> dict[str, Any]:
    return job.config.get(serves) or {}


def check(job: Job, server: ServerAllocation) -> None:
    """Refuse a run its server allocation cannot serve, one line each with the fix."""
    key, interpolation = URL_KEYS[server.serves], "${oc.env:" + server.url_env + "}"
    if ray_job.uses_nemo_rl(job):
        raise UsageError(
            "the profile's server: is for the embedded engine; engine=nemo_rl scores with its NeMo-RL environment",
            fix="use a profile without server:, or engine=embedded",
        )
    used = {(e or {}).get("source") for e in (job.config.get("rewards") or {}).values()}
    if {"rm": "reward_model", "judge": "judge"}[server.serves] not in used:
        raise UsageError(
            f"the profile's server serves {server.serves}, but no rewards entry of {job.step_id} uses it",
            fix=f"set server.serves to the section a rewards entry uses, or add {{source: "
            f"{'reward_model' if server.serves == 'rm' else 'judge'}}} to rewards",
        )
    url = _section(job, server.serves).get("url")
    if url not in (None, interpolation):
        raise UsageError(
            f"{key}={url} names a server, but the profile gives {server.describe()} nodes of its own",
            fix=f"drop {key} (the job fills it from the server's nodes), or use a profile without server:",
        )
    api = _section(job, "rm").get("api", "rlsteps")
    if server.serves == "rm" and api != RM_APIS[server.kind]:
        raise UsageError(
            f"rm.api={api} does not speak to a server of kind {server.kind}",
            fix=f"set rm.api={RM_APIS[server.kind]}, or the profile's server.kind to the server rm.api={api} speaks",
        )
    if server.kind != "triton" and not (server.model or _model_input(job, server)):
        raise UsageError(
            f"{server.describe()} has no model to serve: inputs.{MODEL_INPUTS[server.serves]} is not set",
            fix=f"pass inputs.{MODEL_INPUTS[server.serves]}=PATH, or set the profile's server.model",
        )


def _model_input(job: Job, server: ServerAllocation) -> str | None:
    value = (job.config.get("inputs") or {}).get(MODEL_INPUTS[server.serves])
    return None if value is None else str(value)


def worker_config(job: Job, server: ServerAllocation) -> dict[str, Any]:
    """The worker's config: the served section's URL read from the environment variable the job sets."""
    config = job.worker_config()
    config.setdefault(server.serves, {})["url"] = "${oc.env:" + server.url_env + "}"
    return config


def secret_env(server: ServerAllocation) -> str:
    """The environment variable that carries the served section's token to the worker (and so to the server)."""
    return env_name(SECRET_KEYS[server.serves])


def command(job: Job, server: ServerAllocation, python: str) -> list[str]:
    """The server's command line, listening on every interface of its node at the server's port."""
    port = str(server.listen_port)
    if server.kind == "triton":
        return [*server.command, f"inference.port={port}", *server.args]
    model = server.model or _model_input(job, server) or ""
    if server.kind == "vllm":
        words = [python, "-m", VLLM_SERVER, "--model", model, "--host", "0.0.0.0", "--port", port]
        if server.serves == "rm":
            words += ["--runner", "pooling", "--enable-tokenizer-info-endpoint"]
        else:
            words += ["--served-model-name", _section(job, "judge").get("model") or "judge"]
        return [*words, *server.args]
    words = [python, "-m", SERVER_MODULES[server.serves], "--model", model, "--host", "0.0.0.0", "--port", port]
    words += _rlsteps_options(job, server)
    return [*words, *server.args]


def _rlsteps_options(job: Job, server: ServerAllocation) -> list[str]:
    """The options a run gives the server it starts itself (rlsteps.engine.rewards.sources), here for every
    process of the run: its queue holds what they all send at once."""
    threads = (job.config.get("run") or {}).get("num_threads")
    options = ["--threads", str(threads)] if threads else []
    secret = (job.config.get(server.serves) or {}).get("token" if server.serves == "rm" else "api_key")
    options += ["--token-env", secret_env(server)] if secret else []
    if server.serves == "judge":
        return [*options, "--model-name", _section(job, "judge").get("model") or "judge"]
    rm = _section(job, "rm")
    local = rm.get("server") or {}
    options += ["--device", str(local.get("device", "auto")), "--dtype", str(local.get("dtype", "auto"))]
    options += ["--max-batch", str(local.get("max_batch", 64)), "--max-wait-ms", str(local.get("max_wait_ms", 5))]
    options += ["--truncation-side", str(rm.get("truncation_side", "left"))]
    return options + (["--max-length", str(rm["max_length"])] if rm.get("max_length") is not None else [])
