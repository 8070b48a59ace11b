"""Ray, in this process: the part of Ray's API that NeMo-RL's driver, setup and GRPO step use, over a cluster of
logical nodes with the job's GPUs (no GPU needs to exist).

It stands in for Ray's processes and GPU bundles only, so that NeMo-RL's own code (its placement arithmetic, worker
groups, data sharding and collection) runs unchanged on a CPU in one process:
- an actor is an object of its class, made at `.remote()`; its methods run when called, in order, and their result
  (or exception) waits in an ObjectRef for `ray.get`; coroutines run on one event loop thread of their own;
- placement groups reserve bundles on the logical nodes by strategy and an actor takes its GPUs from its bundle
  (standin_ray_cluster): a request no node or bundle can hold is refused at once (where Ray would wait forever),
  with the arithmetic;
- anything NeMo-RL asks of Ray that is not here raises AttributeError: a gap shows, it is never papered over.

    standin_ray.install(node_count=2, gpus_per_node=8)   # before NeMo-RL is imported
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import queue
import socket
import sys
import threading
import types
from typing import Any

import standin_ray_cluster as cluster

CPUS_PER_NODE = 128


class GetTimeoutError(TimeoutError):
    pass


class RayTaskError(RuntimeError):
    pass


class RayActorError(RuntimeError):
    pass


_STATE: dict[str, Any] = {"initialized": False, "actors": {}, "loop": None}
_CURRENT = threading.local()  # the actor whose method runs now (its node, its GPUs)


# ---------------------------------------------------------------------------------------------------------------
# Object references and the event loop for coroutines
# ---------------------------------------------------------------------------------------------------------------


class ObjectRef:
    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error

    def _result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def __await__(self):
        return self._await().__await__()

    async def _await(self):
        return self._result()


class ObjectRefGenerator:
    """Ray's streaming results; NeMo-RL only tests for it with isinstance here."""


def _loop() -> asyncio.AbstractEventLoop:
    if _STATE["loop"] is None:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="standin-ray-loop", daemon=True).start()
        _STATE["loop"] = loop
    return _STATE["loop"]


def _settle(value: Any) -> Any:
    if inspect.iscoroutine(value):
        return asyncio.run_coroutine_threadsafe(value, _loop()).result()
    return value


def _call(function, *args, **kwargs) -> ObjectRef:
    args = [_unwrap(a) for a in args]
    kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
    try:
        return ObjectRef(_settle(function(*args, **kwargs)))
    except Exception as error:  # as Ray: the error waits in the reference until ray.get
        return ObjectRef(error=error)


def _unwrap(value: Any) -> Any:
    """Ray passes the value of an ObjectRef given as a top-level argument."""
    return value._result() if isinstance(value, ObjectRef) else value


def get(refs, timeout: float | None = None):
    if isinstance(refs, list | tuple):
        return [get(ref) for ref in refs]
    if isinstance(refs, ObjectRef):
        return refs._result()
    raise TypeError(f"ray.get takes ObjectRefs, got {type(refs).__name__}")


def wait(refs, num_returns: int = 1, timeout: float | None = None, **_):
    refs = list(refs)
    return refs[:num_returns], refs[num_returns:]


def put(value: Any) -> ObjectRef:
    return ObjectRef(value)


# ---------------------------------------------------------------------------------------------------------------
# Actors and remote functions
# ---------------------------------------------------------------------------------------------------------------


class ActorMethod:
    def __init__(self, handle: ActorHandle, name: str) -> None:
        self._handle, self._name = handle, name

    def remote(self, *args, **kwargs) -> ObjectRef:
        with self._handle._as_current():
            return _call(getattr(self._handle._instance, self._name), *args, **kwargs)

    def options(self, **_):
        return self


class ActorHandle:
    def __init__(self, instance: Any, placement: cluster.Bundle | None, options: dict[str, Any]) -> None:
        self._instance, self._placement, self._options = instance, placement, options
        self._alive = True

    @contextlib.contextmanager
    def _as_current(self):
        before = getattr(_CURRENT, "actor", None)
        _CURRENT.actor = self
        try:
            yield
        finally:
            _CURRENT.actor = before

    def __getattr__(self, name: str):
        if name.startswith("__") or not hasattr(self._instance, name):
            raise AttributeError(name)
        return ActorMethod(self, name)


class _Options:
    def __init__(self, target: Any, options: dict[str, Any]) -> None:
        self._target, self._options = target, options

    def options(self, **options):
        return type(self)(self._target, {**self._options, **options})

    def __getattr__(self, name: str):  # the class's own attributes (configure_worker, _default_options)
        return getattr(self._target, name)


class RemoteClass(_Options):
    def remote(self, *args, **kwargs) -> ActorHandle:
        bundle = cluster.bundle_for(self._options)
        handle = ActorHandle(None, bundle, self._options)
        with handle._as_current():
            args = [_unwrap(a) for a in args]
            handle._instance = self._target(*args, **{k: _unwrap(v) for k, v in kwargs.items()})
        if self._options.get("name"):
            _STATE["actors"][self._options["name"]] = handle
        return handle


class RemoteFunction(_Options):
    def remote(self, *args, **kwargs) -> ObjectRef:
        bundle = cluster.bundle_for(self._options)
        handle = ActorHandle(None, bundle, self._options)
        with handle._as_current():
            return _call(self._target, *args, **kwargs)


def remote(*args, **kwargs):
    def wrap(target, options):
        return (RemoteClass if inspect.isclass(target) else RemoteFunction)(target, options)

    if len(args) == 1 and callable(args[0]) and not kwargs:
        return wrap(args[0], {})
    return lambda target: wrap(target, kwargs)


def kill(actor: ActorHandle, **_) -> None:
    actor._alive = False


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    try:
        return _STATE["actors"][name]
    except KeyError:
        raise ValueError(f"Failed to look up actor with name '{name}'") from None


# ---------------------------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------------------------


def init(*args, **kwargs):
    _STATE["initialized"] = True
    return types.SimpleNamespace(address_info={"gcs_address": "127.0.0.1:6379"})


def is_initialized() -> bool:
    return _STATE["initialized"]


def shutdown(*_, **__) -> None:
    _STATE["initialized"] = False


class _RuntimeContext:
    gcs_address = "127.0.0.1:6379"
    namespace = "standin"

    def _actor(self) -> ActorHandle | None:
        return getattr(_CURRENT, "actor", None)

    def get_node_id(self) -> str:
        actor = self._actor()
        if actor is not None and actor._placement is not None:
            return actor._placement.node.node_id
        return cluster.CLUSTER["nodes"][0].node_id

    def get_actor_id(self) -> str:
        return str(id(self._actor()))

    def get_job_id(self) -> str:
        return "01000000"

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        return {"GPU": [str(i) for i in get_gpu_ids()]}


def get_runtime_context() -> _RuntimeContext:
    return _RuntimeContext()


def in_process() -> bool:
    """Whether `ray` is this in-process one (else a real Ray's worker process runs the stand-ins: tests/nemo_rl_run.py
    with real Ray)."""
    return isinstance(sys.modules.get("ray"), _StrictModule)


def get_gpu_ids() -> list[int]:
    if not in_process():
        return [int(i) for i in sys.modules["ray"].get_gpu_ids()]
    actor = getattr(_CURRENT, "actor", None)
    if actor is None or actor._placement is None:
        return []
    return list(actor._placement.gpu_ids)


def current_env() -> dict[str, str]:
    """The environment variables Ray would give the current actor's process (its runtime_env); in a real Ray worker
    process, its own."""
    if not in_process():
        return dict(os.environ)
    actor = getattr(_CURRENT, "actor", None)
    if actor is None:
        return {}
    return dict((actor._options.get("runtime_env") or {}).get("env_vars") or {})


def get_node_ip_address() -> str:
    return "127.0.0.1"


class Queue:
    """ray.util.queue.Queue, in this process."""

    def __init__(self, maxsize: int = 0, actor_options: dict | None = None) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize)

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        self._queue.put(item, block, timeout)

    def get(self, block: bool = True, timeout: float | None = None):
        return self._queue.get(block, timeout)

    def put_nowait(self, item) -> None:
        self._queue.put_nowait(item)

    def get_nowait(self):
        return self._queue.get_nowait()

    def empty(self) -> bool:
        return self._queue.empty()

    def qsize(self) -> int:
        return self._queue.qsize()

    def shutdown(self, *_, **__) -> None:
        return None


# ---------------------------------------------------------------------------------------------------------------
# The modules
# ---------------------------------------------------------------------------------------------------------------


class _StrictModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"the in-process Ray has no {self.__name__}.{name}: NeMo-RL reached past what it stands in"
        )


def _module(name: str, **attrs) -> types.ModuleType:
    module = _StrictModule(name)
    module.__dict__.update(attrs)
    module.__path__ = []  # a package: its submodules are the ones below
    sys.modules[name] = module
    return module


def install(node_count: int, gpus_per_node: int, cpus_per_node: int = CPUS_PER_NODE) -> None:
    """The in-process Ray as `ray` (and the submodules NeMo-RL imports), over `node_count` logical nodes."""
    cluster.reset(node_count, gpus_per_node, cpus_per_node)
    _STATE.update(initialized=False, actors={}, loop=None)
    actor = _module("ray.actor", ActorHandle=ActorHandle, ActorClass=RemoteClass)
    exceptions = _module(
        "ray.exceptions",
        GetTimeoutError=GetTimeoutError,
        RayTaskError=RayTaskError,
        RayActorError=RayActorError,
        ActorDiedError=RayActorError,
        RayError=RuntimeError,
    )
    groups = {
        "placement_group": cluster.placement_group,
        "remove_placement_group": cluster.remove_placement_group,
        "placement_group_table": cluster.placement_group_table,
    }
    _module("ray.util.placement_group", PlacementGroup=cluster.PlacementGroup, **groups)
    strategies = _module(
        "ray.util.scheduling_strategies",
        PlacementGroupSchedulingStrategy=cluster.PlacementGroupSchedulingStrategy,
        NodeAffinitySchedulingStrategy=cluster.NodeAffinitySchedulingStrategy,
    )
    util = _module(  # ray.util.placement_group: the function here, the submodule when imported as one
        "ray.util",
        **groups,
        get_node_ip_address=get_node_ip_address,
        scheduling_strategies=strategies,
        queue=_module("ray.util.queue", Queue=Queue, Empty=queue.Empty, Full=queue.Full),
    )
    services = _module("ray._private.services", get_node_ip_address=get_node_ip_address)
    private = _module("ray._private", services=services)
    _module("ray.scripts")
    _module("ray.scripts.scripts", memory_summary=lambda *a, **k: "")
    _module(
        "ray",
        __version__="2.55.1",
        remote=remote,
        get=get,
        wait=wait,
        put=put,
        kill=kill,
        get_actor=get_actor,
        init=init,
        is_initialized=is_initialized,
        shutdown=shutdown,
        cluster_resources=cluster.cluster_resources,
        available_resources=cluster.available_resources,
        nodes=cluster.nodes,
        get_runtime_context=get_runtime_context,
        get_gpu_ids=get_gpu_ids,
        ObjectRef=ObjectRef,
        ObjectRefGenerator=ObjectRefGenerator,
        actor=actor,
        exceptions=exceptions,
        util=util,
        _private=private,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
