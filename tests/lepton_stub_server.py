"""A loopback stand-in for a DGX Cloud Lepton workspace API, strict where the real one is.

Every request must carry the workspace token; every job body must validate against the leptonai
SDK's own LeptonJob model and its create-time checks; node groups must be given by id; a secret
name must follow the SDK's rules for one and must not exist already. Each job's state advances one step
per read of it, as scripted when it was created; deleting a job moves only that job to Deleting.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse
from leptonai.api.v2.job_validation import validate_job_create
from leptonai.api.v2.spec_utils import validate_environment_variable_name
from leptonai.api.v2.types.common import Metadata
from leptonai.api.v2.types.dedicated_node_group import DedicatedNodeGroup
from leptonai.api.v2.types.job import LeptonJob, LeptonJobState, LeptonJobStatus
from leptonai.api.v2.types.replica import Replica
from leptonai.api.v2.types.secret import SecretItem
from pydantic import ValidationError

NODE_GROUPS = {"ng-0a1b2c": "my-node-group", "ng-9z8y7x": "other-group"}


@dataclass
class LeptonStub:
    token: str
    workspace: str = "test-ws"
    states: tuple[str, ...] = ("Queueing", "Running", "Completed")  # the script of each job created from now on
    log: tuple[str, ...] = ("step 1 reward 0.10", "step 2 reward 0.35", "done")
    secrets: dict[str, str] = field(default_factory=dict)  # name -> value, as the secret store holds them
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> the posted body
    scripts: dict[str, tuple[str, ...]] = field(default_factory=dict)  # id -> the states it goes through
    reads: dict[str, int] = field(default_factory=dict)
    secret_deletes_fail: bool = False  # the store answers 500 to each secret delete
    job_creates_fail: bool = False  # the API answers 500 to each job create
    calls: list[tuple[str, str]] = field(default_factory=list)  # (method, path) in order
    url: str = ""

    def app(self) -> FastAPI:
        api = APIRouter(prefix=f"/api/v2/workspaces/{self.workspace}", dependencies=[Depends(self._authorise)])
        api.get("/dedicated-node-groups")(self.node_groups)
        api.get("/usersecrets")(self.list_secrets)
        api.post("/usersecrets")(self.create_secrets)
        api.delete("/usersecrets/{name}")(self.delete_secret)
        api.post("/jobs")(self.create_job)
        api.get("/jobs/{job_id}")(self.get_job)
        api.delete("/jobs/{job_id}")(self.delete_job)
        api.get("/jobs/{job_id}/replicas")(self.replicas)
        api.get("/jobs/{job_id}/replicas/{replica_id}/log")(self.stream_log)
        api.get("/logs")(self.stored_log)
        app = FastAPI()
        app.include_router(api)
        return app

    def _authorise(self, request: Request) -> None:
        self.calls.append((request.method, request.url.path.split(self.workspace, 1)[-1]))
        if request.headers.get("authorization") != f"Bearer {self.token}":
            raise HTTPException(401, "invalid workspace token")

    def node_groups(self) -> list[dict[str, Any]]:
        groups = [
            DedicatedNodeGroup.model_validate({"metadata": {"id": i, "name": n}, "spec": {}, "status": {}})
            for i, n in NODE_GROUPS.items()
        ]
        return [g.model_dump(by_alias=True, exclude_none=True, mode="json") for g in groups]

    def list_secrets(self) -> list[dict[str, Any]]:
        return [{"name": name} for name in self.secrets]  # values never come back

    async def create_secrets(self, request: Request) -> dict[str, str]:
        items = [SecretItem.model_validate(item) for item in await request.json()]
        for item in items:
            try:
                validate_environment_variable_name(item.name, is_secret=True)
            except ValueError as err:
                raise HTTPException(400, f"bad secret name {item.name!r}: {err}") from None
            if item.name.lower().startswith("lepton_"):
                raise HTTPException(400, f"secret names starting with LEPTON_ are reserved: {item.name}")
        if taken := [i.name for i in items if i.name in self.secrets]:
            raise HTTPException(409, f"secret already exists: {taken}")
        self.secrets.update({i.name: i.value for i in items})
        return {}

    def delete_secret(self, name: str) -> dict[str, str]:
        if self.secret_deletes_fail:
            raise HTTPException(500, "the secret store is unavailable")
        if self.secrets.pop(name, None) is None:
            raise HTTPException(404, f"no secret {name}")
        return {}

    async def create_job(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        if self.job_creates_fail:
            raise HTTPException(500, "job creation is unavailable")
        try:
            job = LeptonJob.model_validate(body)
            validate_job_create(job)
        except (ValidationError, ValueError) as err:
            raise HTTPException(422, str(err)) from None
        if unknown := set(job.spec.affinity.allowed_dedicated_node_groups or []) - NODE_GROUPS.keys():
            raise HTTPException(400, f"unknown node group ids {sorted(unknown)}")
        if job.metadata.id_ in self.jobs:
            raise HTTPException(409, f"job {job.metadata.id_} exists")
        self.jobs[job.metadata.id_] = body
        self.scripts[job.metadata.id_] = self.states
        return self._answer(job.metadata.id_, self.states[0])

    def get_job(self, job_id: str) -> dict[str, Any]:
        self._known(job_id)
        read = self.reads[job_id] = self.reads.get(job_id, -1) + 1
        script = self.scripts[job_id]
        return self._answer(job_id, script[min(read, len(script) - 1)])

    def delete_job(self, job_id: str) -> dict[str, str]:
        self._known(job_id)
        self.scripts[job_id] = ("Deleting",)
        self.reads[job_id] = -1
        return {}

    def replicas(self, job_id: str) -> list[dict[str, Any]]:
        self._known(job_id)
        nodes = self.jobs[job_id]["spec"]["completions"]
        ids = [
            f"{job_id}-{rank}-x{rank}q7" for rank in reversed(range(nodes))
        ]  # rank 0 last: the launcher must pick it
        return [
            Replica.model_validate({"id": i, "metadata": {"id": i}}).model_dump(by_alias=True, exclude_none=True)
            for i in ids
        ]

    def stream_log(self, job_id: str, replica_id: str) -> StreamingResponse:
        self._known(job_id)
        if not replica_id.startswith(f"{job_id}-0-"):
            raise HTTPException(400, "only rank 0 logs in this stub")
        text = "\n".join(self.log) + "\n"

        def chunks() -> Iterator[bytes]:  # cut across line boundaries, as a network stream is
            for start in range(0, len(text), 7):
                yield text[start : start + 7].encode()

        return StreamingResponse(chunks(), media_type="text/plain")

    def stored_log(
        self, job: str, start: int, end: int, limit: int, direction: str, replica: str | None = None
    ) -> dict:
        self._known(job)
        if not start < end or direction != "backward":
            raise HTTPException(400, "bad range")
        stamps = [start + 1000 * (i + 1) for i in range(len(self.log))]
        values = [[str(ts), line] for ts, line in zip(stamps, self.log)][::-1][:limit]  # newest first
        return {
            "status": "success",
            "data": {"resultType": "streams", "result": [{"stream": {"replica": replica or ""}, "values": values}]},
        }

    def _known(self, job_id: str) -> None:
        if job_id not in self.jobs:
            raise HTTPException(404, f"job {job_id} not found")

    def _answer(self, job_id: str, state: str) -> dict[str, Any]:
        job = LeptonJob.model_validate(self.jobs[job_id])
        job.metadata = Metadata(id=job_id, name=job_id, created_at=int(time.time() * 1000))
        done = state == "Completed"
        job.status = LeptonJobStatus(
            state=LeptonJobState(state),
            ready=int(state == "Running"),
            active=int(state == "Running"),
            succeeded=int(done),
            failed=int(state == "Failed"),
        )
        return job.model_dump(by_alias=True, exclude_none=True, mode="json")

    def __enter__(self) -> LeptonStub:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self._server = uvicorn.Server(uvicorn.Config(self.app(), log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert self._thread.is_alive() and time.monotonic() < deadline, "the Lepton stub did not start"
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/api/v2/workspaces/{self.workspace}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
