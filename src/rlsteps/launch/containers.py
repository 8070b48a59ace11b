"""Container images for Slurm jobs: squashed once with enroot on a compute node, run through pyxis.

The squashed file's name comes from the image reference (nvcr.io/nvidia/nemo:25.11 ->
nvcr_io_nvidia_nemo_25_11.sqsh), so the cache is keyed by tag: a new push under the same tag is
not seen until `--force-squash` rebuilds it. A digest (image@sha256:...) pins it exactly.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlsteps.launch.base import comment_safe

SQUASH_SCRIPT = "squash.sh"
Action = Literal["given", "reuse", "import"]


def squash_file_name(image: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", image).strip("_") + ".sqsh"


def enroot_uri(image: str) -> str:
    """enroot's form docker://[REGISTRY#]IMAGE[:TAG]: a registry host is set apart from the path by '#'."""
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"docker://{first}#{rest}"
    return f"docker://{image}"


def tag_warning(image: str) -> str | None:
    if "@" in image:
        return None  # pinned by digest
    last = image.rsplit("/", 1)[-1]
    tag = last.partition(":")[2] or None
    if tag not in (None, "latest"):
        return None
    return (
        f"image {image} has {'no tag' if tag is None else 'the tag :latest'}: the squashed file is keyed by the "
        "reference, so a newer image under it is not picked up; pin a tag or digest, or pass --force-squash"
    )


@dataclass(frozen=True)
class ContainerPlan:
    image: str  # as the profile names it
    sqsh: Path  # the squashed file the job runs from
    action: Action  # given: the profile names a .sqsh file; reuse: the cached file exists; import: squash it now
    warning: str | None = None

    def describe(self) -> str:
        return {
            "given": f"container {self.sqsh}",
            "reuse": f"container {self.image}, reusing {self.sqsh}",
            "import": f"container {self.image}, squashed first into {self.sqsh}",
        }[self.action]


def plan_container(image: str, cache_dir: Path, force: bool) -> ContainerPlan:
    if image.endswith(".sqsh"):
        return ContainerPlan(image=image, sqsh=Path(image).expanduser(), action="given")
    sqsh = cache_dir / squash_file_name(image)
    action: Action = "import" if force or not sqsh.exists() else "reuse"
    return ContainerPlan(image=image, sqsh=sqsh, action=action, warning=tag_warning(image))


def squash_script(plan: ContainerPlan, srun_options: list[str], job_name: str) -> str:
    """One srun on a compute node imports the image into a partial file, renamed into place when complete."""
    partial = plan.sqsh.with_name(f"{plan.sqsh.name}.{job_name}.partial")
    srun = [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        f"--job-name=squash-{job_name}",
        *srun_options,
        "enroot",
        "import",
        "--output",
        str(partial),
        enroot_uri(plan.image),
    ]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Squash {comment_safe(plan.image)} once; jobs reuse {comment_safe(str(plan.sqsh))} while it exists.",
            "set -euo pipefail",
            shlex.join(["mkdir", "-p", str(plan.sqsh.parent)]),
            shlex.join(["rm", "-f", str(partial)]),
            shlex.join(srun),
            shlex.join(["mv", "-f", str(partial), str(plan.sqsh)]),
            "",
        ]
    )


def pyxis_options(plan: ContainerPlan, mounts: list[str], workdir: Path) -> list[str]:
    """srun options that run each task inside the squashed image (pyxis), in the submitting directory."""
    options = [f"--container-image={plan.sqsh}"]
    if mounts:
        options.append(f"--container-mounts={','.join(mounts)}")
    return [*options, f"--container-workdir={workdir}"]


def unmounted(paths: list[Path], mounts: list[str]) -> list[Path]:
    """The paths a job needs that no mount (SRC[:DST[:FLAGS]]) shows inside the container at the same place."""
    pairs = [_source_and_target(m) for m in mounts]
    return [p for p in paths if not any(p.is_relative_to(src) and dst / p.relative_to(src) == p for src, dst in pairs)]


def host_side(mount: str) -> Path:
    """The machine's folder a mount (SRC[:DST[:FLAGS]]) shows in the container."""
    return _source_and_target(mount)[0]


def _source_and_target(mount: str) -> tuple[Path, Path]:
    source, _, rest = mount.partition(":")
    return Path(source), Path(rest.partition(":")[0] or source)
