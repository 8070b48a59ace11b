"""The pinned NeMo-RL and NeMo-Gym sources (../shared/upstream, or $RLSTEPS_UPSTREAM_DIR), unpacked once for tests.

Tests judge what rlsteps writes for NeMo-RL with NeMo-RL's and NeMo-Gym's own code, imported from these unpacked
copies (never copied into rlsteps). Without the archives a test skips with the reason, unless
RLSTEPS_REQUIRE_UPSTREAM=1 (CI sets it) makes that a failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHIVES = {"nemo_rl": "nemo-rl-v0.7.0.tar.gz", "nemo_gym": "nemo-gym-v0.4.0.tar.gz"}
ORACLE = Path(__file__).resolve().parent / "nemo_rl_oracle.py"
RUNNER = Path(__file__).resolve().parent / "nemo_rl_run.py"
# NeMo-Gym's row and server models are built on openai's types (Gym pins openai<=2.7.2) and its server modules import
# itsdangerous; neither is an rlsteps dependency, so they are installed once, without dependencies, beside the
# unpacked sources and put on sys.path only by the oracle.
GYM_DEPS = ["openai==2.7.2", "jiter", "distro", "itsdangerous==2.2.0"]
# Running NeMo-RL's own code (tests/nemo_rl_run.py) takes the transformers it pins (>=5.5,<5.9; it asserts < 5.12 at
# import) with the hub and tokenizers that transformers allows, and torchdata's StatefulDataLoader; put first on
# sys.path by that process only, over the venv's newer transformers.
NEMO_RL_DEPS = [
    "transformers==5.8.1",
    "huggingface-hub==1.33.0",
    "tokenizers==0.22.2",
    "torchdata==0.11.0",
    "hydra-core==1.3.8",  # NeMo-RL builds its environments and optimizers with hydra.utils
    "antlr4-python3-runtime==4.9.3",
]


class UpstreamMissing(RuntimeError):
    """The pinned sources (or Gym's few extra packages) are not there: tests skip, or fail under
    RLSTEPS_REQUIRE_UPSTREAM=1."""


def _unavailable(reason: str, switch: str = "UPSTREAM"):
    """Skips the calling test (fails it under RLSTEPS_REQUIRE_<switch>=1); outside pytest, raises UpstreamMissing."""
    if "pytest" not in sys.modules:
        raise UpstreamMissing(reason)
    import required  # imports pytest: only under it

    required.unavailable(reason, switch=switch)


def built_once(target: Path, build: Callable[[Path], Path]) -> Path:
    """target, built once by any of the processes that race for it: `build(staging)` fills a fresh staging folder
    and returns the folder to move into place (the staging folder or one inside it)."""
    if target.is_dir():
        return target
    staging = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        build(staging).rename(target)
    except OSError:  # another process built it first
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _cache() -> Path:
    return Path(os.environ.get("RLSTEPS_HOME") or Path.home() / ".cache" / "rlsteps") / "upstream"


def upstream_dir() -> Path:
    return Path(os.environ.get("RLSTEPS_UPSTREAM_DIR") or REPO.parent / "shared" / "upstream")


def unpacked(name: str) -> Path:
    """The unpacked source tree of `name` (nemo_rl or nemo_gym): the folder holding its package and examples."""
    archive = upstream_dir() / ARCHIVES[name]
    if not archive.is_file():
        _unavailable(f"{archive} is missing: the pinned {name} source that judges rlsteps's NeMo-RL output")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:12]

    def extract(staging: Path) -> Path:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        (top,) = list(staging.iterdir())  # the archive's one top folder
        return top

    return built_once(_cache() / f"{archive.name.removesuffix('.tar.gz')}-{digest}", extract)


class _InertMeta(type):
    """Classes that stand in for a third-party module's names: any attribute, call, subscript or base class works."""

    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _inert(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, _item):
        return cls

    def __or__(cls, _other):
        return cls

    __ror__ = __or__


def _inert(name: str) -> type:
    def instance_attr(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _inert(f"{name}().{attr}")

    def call(self, *args, **kwargs):
        decorated = len(args) == 1 and callable(args[0]) and not kwargs
        return args[0] if decorated else self  # a decorator keeps its target

    def reduce(self):  # picklable, as the real objects are (NeMo-RL saves rollout metrics with its replay buffer)
        return _inert_instance, (name,)

    return _InertMeta(
        name,
        (),
        {"__getattr__": instance_attr, "__call__": call, "__init__": lambda self, *a, **k: None, "__reduce__": reduce},
    )


def _inert_instance(name: str):
    return _inert(name)()


class _InertModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _inert(f"{self.__name__}.{name}")


def inert_module(name: str) -> types.ModuleType:
    """A module whose every name is an inert stand-in."""
    module = _InertModule(name)
    module.__path__ = []
    return module


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an inert module for every module under `names` (force: before the real one) or, as a fallback at the end
    of sys.meta_path, for any module that is not installed."""

    def __init__(self, names: frozenset[str], fallback: bool) -> None:
        self.names, self.fallback = names, fallback

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in self.names or (self.fallback and top not in _NEVER_STUBBED and _imported_by_upstream()):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _InertModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # version checks at import time compare against it
        return module

    def exec_module(self, module):
        return None


def _imported_by_upstream() -> bool:
    """Whether the import statement being run is NeMo-RL's or NeMo-Gym's (another package's optional import of a
    missing module must still fail as it expects)."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("importlib", "_frozen_importlib", __name__)):
            return module.partition(".")[0] in _NEVER_STUBBED
        frame = frame.f_back
    return False


_NEVER_STUBBED = frozenset({"nemo_rl", "nemo_gym", "pydantic", "typing_extensions", "yaml", "omegaconf"})
HEAVY = frozenset(
    {
        "torch",
        "ray",
        "vllm",
        "transformers",
        "megatron",
        "transformer_engine",
        "torchdata",
        "sglang",
        "datasets",
        "wandb",
        "mlflow",
        "swanlab",
        "tensorboard",
        "nvtx",
        "accelerate",
        "deep_ep",
        "flash_attn",
    }
)


@contextlib.contextmanager
def nemo_rl_importable(stub: frozenset[str] = HEAVY):
    """NeMo-RL's and NeMo-Gym's packages importable here (Python 3.11, no GPU): their sources on sys.path, the modules
    in `stub` replaced by inert stand-ins, any other missing module stood in for, and typing.TypedDict served as
    typing_extensions's (pydantic validates TypedDicts only in that form before Python 3.12). Run it in a process of
    its own: the stand-ins stay in sys.modules."""
    import typing

    import typing_extensions

    roots = [str(unpacked("nemo_rl")), str(unpacked("nemo_gym"))]
    finders = [_StandInFinder(stub, fallback=False), _StandInFinder(frozenset(), fallback=True)]
    sys.path[:0] = roots
    sys.meta_path.insert(0, finders[0])
    sys.meta_path.append(finders[1])
    typed_dict = typing.TypedDict
    typing.TypedDict = typing_extensions.TypedDict
    try:
        yield
    finally:
        typing.TypedDict = typed_dict


def gym_deps() -> Path:
    """A folder holding GYM_DEPS (installed there once with pip, without their dependencies)."""
    return installed_once(GYM_DEPS, "gym-deps", "NeMo-Gym's models")


def nemo_rl_deps() -> Path:
    """A folder holding NEMO_RL_DEPS, for the process that runs NeMo-RL's code."""
    return installed_once(NEMO_RL_DEPS, "nemo-rl-deps", "running NeMo-RL's code")


def installed_once(packages: list[str], name: str, purpose: str) -> Path:
    """A folder holding `packages`, installed there once with pip without their dependencies."""

    def install(staging: Path) -> Path:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(staging), *packages],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            _unavailable(f"pip could not install {' '.join(packages)} for {purpose}: {done.stderr[-2000:]}")
        return staging

    digest = hashlib.sha256(" ".join(packages).encode()).hexdigest()[:12]
    return built_once(_cache() / f"{name}-{digest}", install)


def _oracle_run(*args: str) -> str:
    unpacked("nemo_rl"), unpacked("nemo_gym")  # skip (or fail) here, not inside the oracle's process
    env = dict(os.environ, RLSTEPS_GYM_DEPS=str(gym_deps()))
    done = subprocess.run([sys.executable, str(ORACLE), *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the NeMo-RL oracle crashed (exit {done.returncode}):\n{done.stderr[-6000:]}")
    return done.stdout


def _oracle(*args: str) -> list[str]:
    stdout = _oracle_run(*args)
    try:
        return json.loads(stdout)["problems"]
    except (ValueError, KeyError) as error:
        raise RuntimeError(f"the NeMo-RL oracle printed no problems list ({error}):\n{stdout[-3000:]}") from None


def check_master_config(config: dict, driver: str) -> list[str]:
    """What NeMo-RL's and NeMo-Gym's own code find wrong with a master config run by `driver` (grpo: run_grpo.py,
    nemo_gym: run_grpo_nemo_gym.py): one string per problem, each naming the dotted key (tests/nemo_rl_oracle.py)."""
    from omegaconf import OmegaConf

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "master_config.yaml"
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
        return _oracle("check", str(path), "--driver", driver)


def check_rows(path: str | os.PathLike, driver: str) -> list[str]:
    """What NeMo-RL's and NeMo-Gym's own models find wrong with a prompt rows JSONL for `driver`."""
    return _oracle("rows", str(path), "--driver", driver)


def load_nemo_rl_config(path: str | os.PathLike) -> dict:
    """A NeMo-RL config YAML (e.g. unpacked("nemo_rl") / "examples/configs/grpo_math_1B.yaml") as NeMo-RL's own
    load_config resolves it (its `defaults:`, its resolvers), as a plain dict."""
    return json.loads(_oracle_run("load", str(path)))


def master_config_schema() -> dict:
    """MasterConfig's keys as the oracle reads them from NeMo-RL now (what master_config_schema.json ships)."""
    return json.loads(_oracle_run("schema"))


def run_nemo_rl(cases: list[dict], folder: Path) -> dict[str, dict]:
    """NeMo-RL's own driver run on each case's master config (tests/nemo_rl_run.py: one process, a fork per case);
    {name: {"ok": ..., "error", "where", "steps", "log"}}."""
    unpacked("nemo_rl"), unpacked("nemo_gym")  # skip (or fail) here, not inside the runner's process
    nemo_rl_deps()
    env = dict(os.environ, RLSTEPS_GYM_DEPS=str(gym_deps()))
    listing, result = folder / "cases.json", folder / "results.json"
    listing.write_text(json.dumps(cases))
    done = subprocess.run([sys.executable, str(RUNNER), str(listing), "--result", str(result)], env=env,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0 or not result.is_file():
        raise RuntimeError(f"the NeMo-RL runner crashed (exit {done.returncode}):\n{done.stderr[-6000:]}")
    return json.loads(result.read_text())
