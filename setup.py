"""The build's two additions to what pyproject.toml declares (docs/development.md, "The wheel and the sdist").

- The wheel carries the catalog: steps/, manifests/, profiles/ and examples/ lie at the top of the repository and
  are copied into the built package as rlsteps/share/, with the same layout (rlsteps.install.shipped_catalog finds
  them there; an editable install reads them where they lie). MANIFEST.in puts them in the sdist.
- Both carry rlsteps/_source.json: the git commit they were built from (rlsteps.install.source reads it). A wheel
  built from an sdist, where there is no git, keeps the sdist's.
"""

import json
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
CATALOG = ("steps", "manifests", "profiles", "examples")
SOURCE_FILE = Path("rlsteps") / "_source.json"


def git_source() -> dict | None:
    """The commit of the checkout this file lies at the top of, or None (an unpacked sdist, no git)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    if git("rev-parse", "--show-toplevel") != str(HERE):
        return None
    changes = git("status", "--porcelain", "--untracked-files=no")
    return {"git": git("rev-parse", "HEAD"), "dirty": bool(changes)}


def write_source(package_parent: Path) -> None:
    """_source.json from git where this is a checkout; else the one the sdist brought stays."""
    found = git_source()
    if found is not None:
        (package_parent / SOURCE_FILE).write_text(json.dumps(found) + "\n")


class BuildPyWithCatalog(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the catalog and git where they lie
            return
        share = Path(self.build_lib) / "rlsteps" / "share"
        shutil.rmtree(share, ignore_errors=True)
        for folder in CATALOG:
            shutil.copytree(HERE / folder, share / folder, ignore=shutil.ignore_patterns("__pycache__"))
        write_source(Path(self.build_lib))


class SdistWithSource(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        target = Path(base_dir) / "src"
        (target / SOURCE_FILE).unlink(missing_ok=True)  # a hard link to the tree's copy: never write through it
        write_source(target)


setup(cmdclass={"build_py": BuildPyWithCatalog, "sdist": SdistWithSource})
