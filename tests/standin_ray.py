"""Ray, in this process: the part of Ray's API that NeMo-RL's driver, setup and GRPO step use, over a cluster of
logical nodes with the job's GPUs (no GPU needs to exist).

It stands in for Ray's processes and GPU bundles only, so that NeMo-RL's own code (its placement arithmetic, worker
groups, data sharding and collection) runs unchanged on a CPU in one process:
- an actor is an object of its class, made at `.remote()`; its methods run when called, in order, and their result
  (or exception) waits in an ObjectRef for `ray.get`; coroutines run on one event loop thread of their own;
- placement groups reserve bundles on the logical nodes by strategy (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD) and
  an actor takes its GPUs from its bundle: a request no node or bundle can hold is refused at once (where Ray would
  wait forever), with the arithmetic;
- anything NeMo-RL asks of Ray that is not here raises AttributeError: a gap shows, it is never papered over.

    standin_ray.install(node_count=2, gpus_per_node=8)   # before NeMo-RL is imported
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import queue
import socket
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

CPUS_PER_NODE = 128


class GetTimeoutError(TimeoutError):
    pass


class RayTaskError(RuntimeError):
    pass


class RayActorError(RuntimeError):
    pass


class Unschedulable(RuntimeError):
    """What real Ray would wait on forever: the cluster cannot hold the request."""


@dataclass
class Node:
    node_id: str
    gpus: float
    cpus: float
    free_gpus: float = 0.0
    free_cpus: float = 0.0

    def __post_init__(self) -> None:
        self.free_gpus, self.free_cpus = self.gpus, self.cpus


@dataclass
class Bundle:
    node: Node
    gpus: float
    cpus: float
    gpus_used: float = 0.0
    gpu_ids: list[int] = field(default_factory=list)


_STATE: dict[str, Any] = {"nodes": [], "initialized": False, "actors": {}, "loop": None}
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
    def __init__(self, instance: Any, placement: Bundle | None, options: dict[str, Any]) -> None:
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
        bundle = _bundle_for(self._options)
        handle = ActorHandle(None, bundle, self._options)
        with handle._as_current():
            args = [_unwrap(a) for a in args]
            handle._instance = self._target(*args, **{k: _unwrap(v) for k, v in kwargs.items()})
        if self._options.get("name"):
            _STATE["actors"][self._options["name"]] = handle
        return handle


class RemoteFunction(_Options):
    def remote(self, *args, **kwargs) -> ObjectRef:
        bundle = _bundle_for(self._options)
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
# Placement groups and scheduling
# ---------------------------------------------------------------------------------------------------------------


class PlacementGroup:
    _ids = itertools.count()

    def __init__(self, bundles: list[Bundle], specs: list[dict], strategy: str, name: str) -> None:
        self.bundles, self.bundle_specs, self.strategy, self.name = bundles, specs, strategy, name
        self.id = f"pg-{next(self._ids)}"

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    def ready(self) -> ObjectRef:
        return ObjectRef(self)


@dataclass
class PlacementGroupSchedulingStrategy:
    placement_group: PlacementGroup
    placement_group_bundle_index: int = -1
    placement_group_capture_child_tasks: bool | None = None


@dataclass
class NodeAffinitySchedulingStrategy:
    node_id: str
    soft: bool = False


def _fits(node: Node, spec: dict) -> bool:
    return node.free_gpus >= spec.get("GPU", 0) and node.free_cpus >= spec.get("CPU", 0)


def _place(specs: list[dict], strategy: str) -> list[Node]:
    """The node of each bundle, as Ray's strategies choose; Unschedulable when the cluster cannot hold them."""
    nodes: list[Node] = _STATE["nodes"]
    free = {n.node_id: [n.free_gpus, n.free_cpus] for n in nodes}

    def take(node: Node, spec: dict) -> bool:
        room = free[node.node_id]
        if room[0] >= spec.get("GPU", 0) and room[1] >= spec.get("CPU", 0):
            room[0] -= spec.get("GPU", 0)
            room[1] -= spec.get("CPU", 0)
            return True
        return False

    chosen: list[Node] = []
    if strategy in ("STRICT_PACK", "PACK"):
        for node in nodes:  # STRICT_PACK: one node holds all; PACK: as few nodes as it can
            trial = dict((k, list(v)) for k, v in free.items())
            if all(take(node, spec) for spec in specs):
                return [node] * len(specs)
            free.clear()
            free.update(trial)
        if strategy == "STRICT_PACK":
            raise Unschedulable(f"no node can hold all {len(specs)} bundles {specs} (STRICT_PACK)")
    order = itertools.cycle(nodes) if strategy in ("SPREAD", "STRICT_SPREAD") else None
    used: set[str] = set()
    for spec in specs:
        candidates = [next(order) for _ in nodes] if order else nodes
        node = next(
            (n for n in candidates if not (strategy == "STRICT_SPREAD" and n.node_id in used) and take(n, spec)), None
        )
        if node is None:
            raise Unschedulable(
                f"the cluster ({len(nodes)} node(s) x {nodes[0].gpus:g} GPU(s)) cannot hold bundle {spec} after "
                f"{len(chosen)} of {len(specs)} bundles ({strategy})"
            )
        used.add(node.node_id)
        chosen.append(node)
    return chosen


def placement_group(bundles: list[dict], strategy: str = "PACK", name: str = "", **_) -> PlacementGroup:
    nodes = _place(bundles, strategy)
    placed = []
    for node, spec in zip(nodes, bundles):
        node.free_gpus -= spec.get("GPU", 0)
        node.free_cpus -= spec.get("CPU", 0)
        placed.append(Bundle(node, spec.get("GPU", 0), spec.get("CPU", 0)))
    for node in {b.node.node_id: b.node for b in placed}.values():  # the node's GPU ids, as Ray numbers them
        taken = {i for pg in _STATE.setdefault("groups", []) for b in pg.bundles if b.node is node for i in b.gpu_ids}
        ids = (i for i in range(int(node.gpus)) if i not in taken)
        for bundle in (b for b in placed if b.node is node):
            bundle.gpu_ids = [next(ids) for _ in range(int(bundle.gpus))]
    group = PlacementGroup(placed, [dict(b) for b in bundles], strategy, name)
    _STATE["groups"].append(group)
    return group


def remove_placement_group(group: PlacementGroup) -> None:
    for bundle in group.bundles:
        bundle.node.free_gpus += bundle.gpus
        bundle.node.free_cpus += bundle.cpus
    group.bundles = []
    _STATE["groups"].remove(group)


def placement_group_table(group: PlacementGroup) -> dict[str, Any]:
    return {
        "placement_group_id": group.id,
        "name": group.name,
        "strategy": group.strategy,
        "state": "CREATED",
        "bundles": dict(enumerate(group.bundle_specs)),
        "bundles_to_node_id": {i: b.node.node_id for i, b in enumerate(group.bundles)},
    }


def _bundle_for(options: dict[str, Any]) -> Bundle | None:
    """The bundle an actor or task runs in; its GPU request taken from it (Unschedulable if it cannot)."""
    strategy = options.get("scheduling_strategy")
    if not isinstance(strategy, PlacementGroupSchedulingStrategy):
        return None
    group, index = strategy.placement_group, strategy.placement_group_bundle_index
    if not group.bundles:
        raise Unschedulable(f"placement group {group.name!r} was removed")
    bundle = group.bundles[max(index, 0)]
    wanted = float(options.get("num_gpus") or 0)
    if bundle.gpus_used + wanted > bundle.gpus + 1e-9:
        raise Unschedulable(
            f"bundle {index} of {group.name!r} has {bundle.gpus - bundle.gpus_used:g} of {bundle.gpus:g} GPU(s) "
            f"left; an actor asks for {wanted:g}"
        )
    bundle.gpus_used += wanted
    return bundle


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


def cluster_resources() -> dict[str, float]:
    nodes = _STATE["nodes"]
    return {"GPU": sum(n.gpus for n in nodes), "CPU": sum(n.cpus for n in nodes)}


def available_resources() -> dict[str, float]:
    nodes = _STATE["nodes"]
    return {"GPU": sum(n.free_gpus for n in nodes), "CPU": sum(n.free_cpus for n in nodes)}


def nodes() -> list[dict[str, Any]]:
    return [
        {
            "NodeID": n.node_id,
            "Alive": True,
            "NodeManagerAddress": "127.0.0.1",
            "NodeName": f"node{i}",
            "Resources": {"GPU": n.gpus, "CPU": n.cpus, f"node:127.0.0.{i + 1}": 1.0},
            "Labels": {},
        }
        for i, n in enumerate(_STATE["nodes"])
    ]


class _RuntimeContext:
    gcs_address = "127.0.0.1:6379"
    namespace = "standin"

    def _actor(self) -> ActorHandle | None:
        return getattr(_CURRENT, "actor", None)

    def get_node_id(self) -> str:
        actor = self._actor()
        if actor is not None and actor._placement is not None:
            return actor._placement.node.node_id
        return _STATE["nodes"][0].node_id

    def get_actor_id(self) -> str:
        return str(id(self._actor()))

    def get_job_id(self) -> str:
        return "01000000"

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        return {"GPU": [str(i) for i in get_gpu_ids()]}


def get_runtime_context() -> _RuntimeContext:
    return _RuntimeContext()


def get_gpu_ids() -> list[int]:
    actor = getattr(_CURRENT, "actor", None)
    if actor is None or actor._placement is None:
        return []
    return list(actor._placement.gpu_ids)


def current_env() -> dict[str, str]:
    """The environment variables Ray would give the current actor's process (its runtime_env)."""
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    _STATE.update(
        nodes=[Node(f"node{i:02d}" + "0" * 52, gpus_per_node, cpus_per_node) for i in range(node_count)],
        initialized=False,
        actors={},
        groups=[],
    )
    actor = _module("ray.actor", ActorHandle=ActorHandle, ActorClass=RemoteClass)
    exceptions = _module(
        "ray.exceptions",
        GetTimeoutError=GetTimeoutError,
        RayTaskError=RayTaskError,
        RayActorError=RayActorError,
        ActorDiedError=RayActorError,
        RayError=RuntimeError,
    )
    pg_module = _module(
        "ray.util.placement_group",
        PlacementGroup=PlacementGroup,
        placement_group=placement_group,
        remove_placement_group=remove_placement_group,
        placement_group_table=placement_group_table,
        get_current_placement_group=lambda: None,
    )
    strategies = _module(
        "ray.util.scheduling_strategies",
        PlacementGroupSchedulingStrategy=PlacementGroupSchedulingStrategy,
        NodeAffinitySchedulingStrategy=NodeAffinitySchedulingStrategy,
    )
    util = _module(
        "ray.util",
        placement_group=placement_group,
        remove_placement_group=remove_placement_group,
        placement_group_table=placement_group_table,
        get_node_ip_address=get_node_ip_address,
        scheduling_strategies=strategies,
        queue=_module("ray.util.queue", Queue=Queue, Empty=queue.Empty, Full=queue.Full),
    )
    util.__dict__["placement_group"] = placement_group  # the function; the submodule is reached by import
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
        cluster_resources=cluster_resources,
        available_resources=available_resources,
        nodes=nodes,
        get_runtime_context=get_runtime_context,
        get_gpu_ids=get_gpu_ids,
        ObjectRef=ObjectRef,
        ObjectRefGenerator=ObjectRefGenerator,
        actor=actor,
        exceptions=exceptions,
        util=util,
        _private=private,
    )
    del pg_module


def free_port() -> int:
    return _free_port()
