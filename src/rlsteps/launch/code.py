"""The job carries its code: a wheel of the rlsteps that compiled it, built offline into the job directory.

A cluster job runs in an environment that need not have rlsteps (a stock container image, a virtual
environment with torch and the engine's dependencies): the job puts the wheel itself on PYTHONPATH
(Python imports a pure-Python wheel as a zip archive), so it runs exactly the code that compiled it,
whatever is installed there. The wheel is built from the imported package, from an installed copy or
a source checkout alike, with no build backend and no network; the same files give the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "rlsteps"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: the wheel's bytes depend on its files alone
SKIPPED_PARTS = {"__pycache__"}
SKIPPED_SUFFIXES = {".pyc", ".pyo"}
ON_PATH = 'export PYTHONPATH="$0${PYTHONPATH:+:$PYTHONPATH}"; exec "$@"'  # $0: the wheel; "$@": the command


@dataclass(frozen=True)
class CodeWheel:
    name: str  # rlsteps-<version>-py3-none-any.whl
    content: bytes
    files: int  # package files in it

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


def package_version() -> str:
    import rlsteps

    return rlsteps.__version__


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
    """The wheel, in memory: the package's files and a dist-info that names its version and dependencies."""
    files = [(name, path.read_bytes()) for name, path in package_files(root)]
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
