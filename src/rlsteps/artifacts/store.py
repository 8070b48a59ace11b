"""The artifact store: named, numbered, immutable copies of artifacts under one root, local or any fsspec URL.

Layout: ROOT/NAME/vN/ holds the artifact's files and, written last, `rlsteps_artifact.json` with its type,
producer step and job, config hash, inputs with their versions, created, size and content hash. A version
is listed only once its metadata file exists, so a copy cut short is never seen. The root is
`artifacts: {root: DIR_OR_URL}` in ./rlsteps.yaml, or $RLSTEPS_ARTIFACTS.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsspec.core import url_to_fs
from omegaconf import OmegaConf

from rlsteps.catalog import Catalog
from rlsteps.contract.artifact import METADATA_FILE, fingerprint
from rlsteps.errors import ArtifactError, UsageError

ROOT_ENV = "RLSTEPS_ARTIFACTS"
DEFAULT_ROOT = Path(".rlsteps") / "artifacts"  # under the project's state directory when nothing is configured
SCHEME = "artifact:"
VERSION_DIR = re.compile(r"v(\d+)")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class Version:
    name: str
    number: int
    folder: str  # ROOT/NAME/vN
    metadata: dict[str, Any]

    @property
    def url(self) -> str:
        """What a step reads: the folder, or the one file a single-file artifact (a prompt file) holds."""
        entry = self.metadata.get("entry")
        return f"{self.folder}/{entry}" if entry else self.folder

    @property
    def label(self) -> str:
        return f"{self.name}:v{self.number}"


def store_root() -> str:
    """$RLSTEPS_ARTIFACTS, else `artifacts.root` in ./rlsteps.yaml, else ./.rlsteps/artifacts (the project's state
    directory, beside its jobs and runs); a relative local root is taken from the cwd."""
    root = os.environ.get(ROOT_ENV)
    settings = Path.cwd() / "rlsteps.yaml"
    if not root and settings.is_file():
        raw = OmegaConf.to_container(OmegaConf.load(settings), resolve=False) or {}
        root = ((raw.get("artifacts") or {}) if isinstance(raw, dict) else {}).get("root")
    root = root or DEFAULT_ROOT
    return str(root) if "://" in str(root) else str(Path(str(root)).expanduser().absolute())


def parse_reference(ref: str) -> tuple[str, int | None]:
    """artifact:NAME, artifact:NAME:latest -> (NAME, None); artifact:NAME:vN -> (NAME, N)."""
    name, _, version = ref.removeprefix(SCHEME).partition(":")
    if not NAME.fullmatch(name) or not (version in ("", "latest") or VERSION_DIR.fullmatch(version)):
        raise UsageError(
            f"'{ref}' is not an artifact reference", fix="write artifact:NAME, artifact:NAME:latest or artifact:NAME:v3"
        )
    return name, None if version in ("", "latest") else int(version[1:])


class ArtifactStore:
    def __init__(self, root: str):
        self.root = root.rstrip("/")
        self.fs, self.path = url_to_fs(self.root)

    def _url(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def names(self) -> list[str]:
        if not self.fs.isdir(self.path):
            return []
        return sorted(
            p.rstrip("/").rsplit("/", 1)[-1]
            for p in self.fs.ls(self.path, detail=False)
            if self.fs.isdir(p) and self.versions(p.rstrip("/").rsplit("/", 1)[-1])
        )

    def versions(self, name: str) -> list[Version]:
        """The complete versions of NAME, oldest first."""
        found = []
        for number in self._numbers(name, complete_only=True):
            meta_path = f"{self.path}/{name}/v{number}/{METADATA_FILE}"
            with self.fs.open(meta_path, "rt") as f:
                found.append(Version(name, number, self._url(name, f"v{number}"), json.load(f)))
        return found

    def _numbers(self, name: str, complete_only: bool) -> list[int]:
        folder = f"{self.path}/{name}"
        if not self.fs.isdir(folder):
            return []
        numbers = []
        for entry in self.fs.ls(folder, detail=False):
            base = entry.rstrip("/").rsplit("/", 1)[-1]
            match = VERSION_DIR.fullmatch(base.split(".tmp-")[0])
            if match and (
                not complete_only or (base == f"v{match[1]}" and self.fs.isfile(f"{entry.rstrip('/')}/{METADATA_FILE}"))
            ):
                numbers.append(int(match[1]))
        return sorted(set(numbers))

    def get(self, name: str, number: int | None = None) -> Version:
        versions = self.versions(name)
        if not versions:
            known = ", ".join(self.names()) or "none yet"
            raise ArtifactError(f"no artifact named '{name}' in the store {self.root}", fix=f"known names: {known}")
        if number is None:
            return versions[-1]
        for version in versions:
            if version.number == number:
                return version
        have = ", ".join(f"v{v.number}" for v in versions)
        raise ArtifactError(f"artifact '{name}' has no version v{number} in {self.root}", fix=f"its versions: {have}")

    def resolve(self, ref: str) -> Version:
        return self.get(*parse_reference(ref))

    def find_source(self, source_fingerprint: str) -> Version | None:
        """The store version published from the artifact with this fingerprint, if any."""
        for name in self.names():
            for version in self.versions(name):
                if version.metadata.get("source", {}).get("fingerprint") == source_fingerprint:
                    return version
        return None

    def owner_of(self, ref: str) -> Version | None:
        """The store version a reference points into (ROOT/NAME/vN, as a path or a URL), if any."""
        fs, path = url_to_fs(ref)
        if type(fs) is not type(self.fs) or not path.startswith(self.path + "/"):
            return None
        parts = path[len(self.path) + 1 :].split("/")
        if len(parts) < 2 or not VERSION_DIR.fullmatch(parts[1]):
            return None
        try:
            return self.get(parts[0], int(parts[1][1:]))
        except ArtifactError:
            return None

    def publish(self, catalog: Catalog, source: str, name: str) -> Version:
        """Copy SOURCE into NAME's next version: files into vN.tmp-*, renamed to vN, the metadata file last."""
        from rlsteps.artifacts.detect import detect_types

        if not NAME.fullmatch(name):
            raise UsageError(f"'{name}' is not a valid artifact name", fix="use letters, digits, '.', '_' and '-'")
        src_fs, src_path = url_to_fs(source)
        if not src_fs.exists(src_path):
            raise ArtifactError(
                f"{source} does not exist",
                fix="publish a finished run's output artifact, e.g. .rlsteps/runs/rl_rs-tiny/policy",
            )
        own = _read_metadata(src_fs, src_path)
        types = detect_types(catalog, source)
        if not types:
            raise ArtifactError(
                f"{source} is not a recognised artifact", fix=f"known types: {', '.join(sorted(catalog.types))}"
            )
        number = max(self._numbers(name, complete_only=False), default=0) + 1
        staging = f"{self.path}/{name}/v{number}.tmp-{uuid.uuid4().hex[:8]}"
        digest, size = _copy_tree(src_fs, src_path, self.fs, staging)
        final = f"{self.path}/{name}/v{number}"
        if self.fs.exists(final):
            raise ArtifactError(f"{self._url(name, f'v{number}')} appeared while publishing", fix="publish again")
        self.fs.mv(staging, final, recursive=True)
        metadata = {
            "name": name,
            "version": number,
            "type": types[0],
            "entry": _entry(src_fs, src_path),
            "producer": own.get("producer"),
            "config_hash": own.get("config_hash"),
            "counters": own.get("counters"),
            "inputs": self._link_inputs(own),
            "source": {"ref": source, "fingerprint": fingerprint(source), "created": own.get("created")},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "size_bytes": size,
            "content_hash": digest,
        }
        with self.fs.open(f"{final}/{METADATA_FILE}", "wt") as f:
            f.write(json.dumps(metadata, indent=2, sort_keys=True, default=str))
        return self.get(name, number)

    def _link_inputs(self, source_metadata: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Each input of the source with the version it read, and the store version it is, where one is."""
        refs = source_metadata.get("inputs") or {}
        read = source_metadata.get("input_versions") or {}
        linked = {}
        for input_name, ref in refs.items():
            version = read.get(input_name)
            # a path into the store names its version (versions never change); else match what the run read
            owner = self.owner_of(str(ref)) or (self.find_source(version) if version else None)
            linked[input_name] = {"ref": ref, "version": version, "artifact": owner.label if owner else None}
        return linked

    def lineage(self, version: Version, depth: int = 0, seen: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
        """(depth, line) rows: the version, then each input, and each published input's own inputs, recursively."""
        meta = version.metadata
        producer = meta.get("producer") or {}
        rows = [
            (
                depth,
                f"{version.label} ({meta.get('type')}) from {producer.get('step') or 'outside rlsteps'}"
                f"{' job ' + producer['job'] if producer.get('job') else ''}, config {meta.get('config_hash')}",
            )
        ]
        for input_name, item in sorted((meta.get("inputs") or {}).items()):
            label = item.get("artifact")
            if label and label not in seen:
                rows.append((depth + 1, f"{input_name} <- {label}"))
                rows += self.lineage(self.resolve(SCHEME + label), depth + 2, seen | {version.label})
            else:
                rows.append((depth + 1, f"{input_name} <- {item.get('ref')} (version {item.get('version')})"))
        return rows


def resolve_reference(ref: str) -> str:
    """An artifact:NAME[:vN|:latest] reference -> the URL of that version; any other reference unchanged."""
    if not ref.startswith(SCHEME):
        return ref
    return ArtifactStore(store_root()).resolve(ref).url


def _entry(fs: Any, path: str) -> str | None:
    return None if fs.isdir(path) else path.rstrip("/").rsplit("/", 1)[-1]


def _read_metadata(fs: Any, path: str) -> dict[str, Any]:
    target = f"{path.rstrip('/')}/{METADATA_FILE}"
    if not fs.isfile(target):
        return {}
    with fs.open(target, "rt") as f:
        return json.load(f)


def _copy_tree(src_fs: Any, src: str, dst_fs: Any, dst: str) -> tuple[str, int]:
    """Copy a file or folder (its metadata file aside) and return (sha256 over paths and bytes, total size)."""
    files = sorted(src_fs.find(src)) if src_fs.isdir(src) else [src]
    base = src.rstrip("/") if src_fs.isdir(src) else src.rstrip("/").rsplit("/", 1)[0]
    digest, size = hashlib.sha256(), 0
    dst_fs.makedirs(dst, exist_ok=True)
    for file in files:
        relative = file[len(base) + 1 :]
        if relative == METADATA_FILE:
            continue
        digest.update(relative.encode() + b"\0")
        dst_fs.makedirs(f"{dst}/{relative}".rsplit("/", 1)[0], exist_ok=True)
        with src_fs.open(file, "rb") as reader, dst_fs.open(f"{dst}/{relative}", "wb") as writer:
            while chunk := reader.read(COPY_CHUNK):
                digest.update(chunk)
                writer.write(chunk)
                size += len(chunk)
    return f"sha256:{digest.hexdigest()}", size
