"""The job carries its code: a wheel of the rlsteps that compiled it, built offline into the job directory.

A cluster job runs in an environment that need not have rlsteps (a stock container image, a virtual
environment with torch and the engine's dependencies): the job puts the wheel itself on PYTHONPATH
(Python imports a pure-Python wheel as a zip archive), so it runs exactly the code that compiled it,
whatever is installed there. The wheel is built from the imported package, from an installed copy or
a source checkout alike, with no build backend and no network; the same files give the same bytes.

Where no file can travel with the job (a job spec posted to an API), the wheel travels in its environment:
env_chunks() cuts it, base64-encoded, into variables each well under Linux's limit on one environment string,
and unpack_lines() is the shell that rebuilds it in the container, checks its sha256 and puts it on PYTHONPATH.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import json
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rlsteps.install import SOURCE_FILE, source

PACKAGE = "rlsteps"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: the wheel's bytes depend on its files alone
SKIPPED_PARTS = {"__pycache__"}
SKIPPED_SUFFIXES = {".pyc", ".pyo"}
ON_PATH = 'export PYTHONPATH="$0${PYTHONPATH:+:$PYTHONPATH}"; exec "$@"'  # $0: the wheel; "$@": the command

ARG_STRLEN = 32 * 4096  # Linux's MAX_ARG_STRLEN: the longest argument or NAME=value string a program can be given
ENV_CHUNK = 96 * 1024  # base64 characters in one variable: well under ARG_STRLEN
ENV_PREFIX = "RLSTEPS_CODE"  # RLSTEPS_CODE_0..N-1: the chunks; _CHUNKS: their count; _SHA256: the wheel's
# Rebuilds the wheel at argv[1] from the chunks: the standard library only (base64, hashlib), in any image's python3.
UNPACK = f"""\
import base64, hashlib, os, sys
path, env = sys.argv[1], os.environ
try:
    count = int(env["{ENV_PREFIX}_CHUNKS"])
    data = base64.b64decode("".join(env["{ENV_PREFIX}_%d" % i] for i in range(count)), validate=True)
except KeyError as err:
    sys.exit("rlsteps: cannot rebuild the code of this job: %s is not set" % err)
except ValueError as err:
    sys.exit("rlsteps: cannot rebuild the code of this job from {ENV_PREFIX}_*: %s" % err)
found, expected = hashlib.sha256(data).hexdigest(), env.get("{ENV_PREFIX}_SHA256")
if found != expected:
    sys.exit("rlsteps: the code of this job arrived damaged: sha256 %s, expected %s" % (found, expected))
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path + ".partial", "wb") as out:
    out.write(data)
os.replace(path + ".partial", path)
"""


@dataclass(frozen=True)
class CodeWheel:
    name: str  # rlsteps-<version>-py3-none-any.whl
    content: bytes
    files: int  # package files in it

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


def package_version() -> str:
    from rlsteps.install import version

    return version()


def wheel_name() -> str:
    return f"{PACKAGE}-{package_version()}-py3-none-any.whl"


def package_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(name in the wheel, file) for every file of the package, sorted; bytecode caches left out."""
    root = root or Path(__import__(PACKAGE).__file__).resolve().parent
    found = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and not SKIPPED_PARTS.intersection(relative.parts) and path.suffix not in SKIPPED_SUFFIXES:
            found.append((f"{PACKAGE}/{relative.as_posix()}", path))
    return found


def build_wheel(root: Path | None = None) -> CodeWheel:
    """The wheel, in memory: the package's files (with the commit they came from) and a dist-info that names its
    version and dependencies."""
    files = [(name, path.read_bytes()) for name, path in package_files(root)]
    if f"{PACKAGE}/{SOURCE_FILE}" not in {name for name, _ in files}:  # a checkout's package: its commit, from git
        files.append((f"{PACKAGE}/{SOURCE_FILE}", _source_record()))
    dist_info = f"{PACKAGE}-{package_version()}.dist-info"
    files += [
        (f"{dist_info}/METADATA", _metadata().encode()),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: rlsteps\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{dist_info}/entry_points.txt", b"[console_scripts]\nrlsteps = rlsteps.cli:entry\n"),
    ]
    record = "".join(f"{name},sha256={_digest(data)},{len(data)}\n" for name, data in files)
    files.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files:
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return CodeWheel(wheel_name(), buffer.getvalue(), sum(1 for name, _ in files if name.startswith(f"{PACKAGE}/")))


def write_wheel(directory: Path) -> CodeWheel:
    """Build the wheel into a directory (the job's, on the shared filesystem); written whole, then renamed."""
    wheel = build_wheel()
    partial = directory / f".{wheel.name}.partial"
    partial.write_bytes(wheel.content)
    partial.replace(directory / wheel.name)
    return wheel


def on_path(wheel: str, command: list[str]) -> list[str]:
    """The command run with the wheel first on PYTHONPATH (kept for the processes it starts), in any image."""
    return ["/bin/sh", "-c", ON_PATH, wheel, *command]


def env_chunks(wheel: bytes, chunk: int = ENV_CHUNK) -> dict[str, str]:
    """A wheel as environment variables: its sha256, the count of chunks, then its base64 text in chunks.

    The wheel's files are already deflated: compressing it again saves about 4%, not worth a decompressor.
    """
    text = base64.b64encode(wheel).decode()
    chunks = [text[start : start + chunk] for start in range(0, len(text), chunk)]
    head = {f"{ENV_PREFIX}_SHA256": hashlib.sha256(wheel).hexdigest(), f"{ENV_PREFIX}_CHUNKS": str(len(chunks))}
    return head | {f"{ENV_PREFIX}_{i}": c for i, c in enumerate(chunks)}


def is_chunk(name: str) -> bool:
    return name.startswith(f"{ENV_PREFIX}_") and name[len(ENV_PREFIX) + 1 :].isdigit()


def elided(name: str, value: str) -> str:
    """A chunk's value as a dry run shows it: its size, not its text."""
    return f"<{len(value) / 1024:.0f} KiB of the job's wheel, elided>" if is_chunk(name) else value


def unpack_lines(path: str, env: dict[str, str]) -> list[str]:
    """Shell lines that rebuild env_chunks' wheel at path (any damage stops the script with one line), put it
    first on PYTHONPATH for everything started after them, and drop the chunks from the environment."""
    chunks = [name for name in env if is_chunk(name)]
    return [
        f"python3 -c {shlex.quote(UNPACK)} {shlex.quote(path)}",
        f'export PYTHONPATH={shlex.quote(path)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        f"unset {' '.join(chunks)}",
    ]


def _source_record() -> bytes:
    found = {key: value for key, value in source().items() if key in ("git", "dirty")}
    return (json.dumps(found) + "\n").encode()


def _metadata() -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {PACKAGE}", f"Version: {package_version()}"]
    try:
        installed = importlib.metadata.metadata(PACKAGE)
        lines += [f"Requires-Python: {installed['Requires-Python']}"] if installed["Requires-Python"] else []
        lines += [f"Requires-Dist: {r}" for r in installed.get_all("Requires-Dist") or []]
    except importlib.metadata.PackageNotFoundError:
        pass
    return "\n".join(lines) + "\n"


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
