"""Step manifests -> typed Step objects, the artifact type graph, and step lookup.

Steps come from several folders, each holding manifests/ (a TOML file a step, and types.toml) and steps/ (each step's
configs), like PATH: the project folder, the folders of $RLSTEPS_PATH, then the catalog rlsteps ships (catalog_roots).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsteps.errors import UsageError
from rlsteps.install import PACKAGE_DIR, ROOT_ENV, shipped_catalog
from rlsteps.manifest_schema import read_manifest, read_types

PATH_ENV = "RLSTEPS_PATH"  # users' own step folders, os.pathsep between them
PROJECT_FILE = "rlsteps.yaml"  # a project folder holds it (its profiles), and may hold manifests/ and steps/


@dataclass(frozen=True)
class ArtifactType:
    name: str
    description: str
    is_a: tuple[str, ...] = ()
    convert_to: tuple[tuple[str, str], ...] = ()
    abstract: bool = False
    detect: str | None = None


@dataclass(frozen=True)
class ArtifactSpec:
    """One input or output of a step, bound to the config key that holds its reference."""

    name: str
    type: str
    key: str
    description: str = ""
    required: bool = True
    required_unless: str | None = None  # a config key that, when set, makes this input unnecessary
    # the kind of rewards entry (reward_model | judge) that needs this input: without one in the config it is unused
    reward_source: str | None = None
    type_key: str | None = None  # an output only: a config key that chooses its type (`type` is the default)
    hub_id: bool = False  # an input that may also name a Hugging Face Hub model (org/name) the job's machines fetch


@dataclass(frozen=True)
class Parameter:
    name: str
    description: str
    default: Any = None


@dataclass(frozen=True)
class Step:
    id: str
    name: str
    category: str
    description: str
    algorithm: str
    manifest_path: Path
    config_dir: Path
    tags: tuple[str, ...] = ()
    configs: tuple[str, ...] = ()
    consumes: tuple[ArtifactSpec, ...] = ()
    produces: tuple[ArtifactSpec, ...] = ()
    parameters: tuple[Parameter, ...] = ()
    strategies: tuple[dict[str, str], ...] = ()
    errors: tuple[dict[str, str], ...] = ()
    resources: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        """The id as a file-name-safe word: rl/rs -> rl_rs."""
        return self.id.replace("/", "_")

    def config_path(self, name: str) -> Path:
        return self.config_dir / f"{name}.yaml"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "category": self.category,
            "description": self.description,
            "algorithm": self.algorithm,
            "tags": list(self.tags),
            "configs": list(self.configs),
            "consumes": [vars(a) for a in self.consumes],
            "produces": [vars(a) for a in self.produces],
            "parameters": [vars(p) for p in self.parameters],
            "strategies": list(self.strategies),
            "errors": list(self.errors),
            "resources": self.resources,
            "reference": self.reference,
            "manifest": str(self.manifest_path),
        }


@dataclass(frozen=True)
class Catalog:
    roots: tuple[Path, ...]  # where its steps were read, the first winning
    steps: dict[str, Step]
    types: dict[str, ArtifactType]

    def find(self, ref: str) -> Step:
        """A full id (rl/rs) or a unique suffix (rs); unknown ids suggest the closest."""
        if ref in self.steps:
            return self.steps[ref]
        matches = [s for sid, s in self.steps.items() if sid.endswith("/" + ref.strip("/"))]
        shallowest = [s for s in matches if s.id.count("/") == min(m.id.count("/") for m in matches)]
        if len(shallowest) == 1:  # rlhf is rl/rlhf; rl/nemo_rl/rlhf goes by nemo_rl/rlhf or its full id
            return shallowest[0]
        if len(matches) > 1:
            ids = ", ".join(sorted(s.id for s in matches))
            raise UsageError(f"step '{ref}' is ambiguous: {ids}", fix="give the full id")
        names = {**{sid.rsplit("/", 1)[-1]: sid for sid in self.steps}, **{sid: sid for sid in self.steps}}
        close = [names[m] for m in difflib.get_close_matches(ref, list(names), n=3, cutoff=0.4)]
        hint = f"did you mean {', '.join(dict.fromkeys(close))}?" if close else "run `rlsteps list` to see the steps"
        raise UsageError(f"unknown step '{ref}'", fix=hint)

    def ancestors(self, type_name: str) -> set[str]:
        """The type itself and every type it is_a, transitively."""
        seen, todo = set(), [type_name]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.types[name].is_a if name in self.types else ())
        return seen

    def is_a(self, type_name: str, required: str) -> bool:
        return required in self.ancestors(type_name)

    def subtypes(self, type_name: str) -> list[str]:
        """Every type that may stand where type_name is required, itself first."""
        return [type_name] + sorted(t for t in self.types if t != type_name and self.is_a(t, type_name))

    def filter(self, consumes: str | None = None, produces: str | None = None, tag: str | None = None) -> list[Step]:
        def accepts(specs: tuple[ArtifactSpec, ...], wanted: str | None) -> bool:
            # the type, a subtype of it, or a type it stands for (a step consuming prompts takes a prompt_jsonl)
            return wanted is None or any(self.is_a(s.type, wanted) or self.is_a(wanted, s.type) for s in specs)

        return [
            s
            for s in sorted(self.steps.values(), key=lambda s: s.id)
            if accepts(s.consumes, consumes) and accepts(s.produces, produces) and (tag is None or tag in s.tags)
        ]


def catalog_roots() -> list[Path]:
    """The folders steps are read from, the first to define a step id winning: the project (./ when it holds
    rlsteps.yaml and a manifests/ folder), each folder of $RLSTEPS_PATH in order, then the catalog rlsteps ships."""
    roots = []
    if (Path.cwd() / PROJECT_FILE).is_file() and (Path.cwd() / "manifests").is_dir():
        roots.append(Path.cwd())
    for entry in filter(None, os.environ.get(PATH_ENV, "").split(os.pathsep)):
        folder = Path(entry).expanduser()
        if not (folder / "manifests").is_dir():
            raise UsageError(
                f"${PATH_ENV} names {entry}, which has no manifests/ folder",
                fix="point it at folders that each hold manifests/ (a step's TOML) and steps/ (its configs)",
            )
        roots.append(folder)
    shipped = shipped_catalog()
    if shipped is None:
        raise UsageError(
            f"this rlsteps ({PACKAGE_DIR}) lacks the catalog it ships (manifests/ and steps/)",
            fix=f"reinstall rlsteps from its wheel or sdist, or set {ROOT_ENV} to an rlsteps checkout",
        )
    return list({root.resolve(): root.resolve() for root in [*roots, shipped]}.values())


def load_catalog(roots: Path | list[Path] | None = None) -> Catalog:
    """The steps and types of the roots (catalog_roots() when None); a root earlier in the list wins an id or a type
    name that a later one defines too."""
    roots = [roots] if isinstance(roots, Path) else list(roots or catalog_roots())
    types: dict[str, ArtifactType] = {}
    steps: dict[str, Step] = {}
    for root in reversed(roots):
        if (root / "manifests" / "types.toml").is_file():
            types.update(_load_types(root / "manifests" / "types.toml"))
        steps.update(_load_steps(root))
    catalog = Catalog(roots=tuple(roots), steps=steps, types=types)
    _check(catalog)
    return catalog


def _load_steps(root: Path) -> dict[str, Step]:
    steps: dict[str, Step] = {}
    for path in sorted((root / "manifests").rglob("*.toml")):
        if path.name == "types.toml":
            continue
        step = _load_step(path, root)
        if step.id in steps:
            raise UsageError(f"duplicate step id '{step.id}' in {path} and {steps[step.id].manifest_path}")
        steps[step.id] = step
    return steps


def _load_types(path: Path) -> dict[str, ArtifactType]:
    return {
        name: ArtifactType(
            name=name,
            description=entry.description,
            is_a=tuple(entry.is_a),
            convert_to=tuple((target, step) for target, step in entry.convert_to),
            abstract=entry.abstract,
            detect=entry.detect,
        )
        for name, entry in read_types(path).types.items()
    }


def _load_step(path: Path, root: Path) -> Step:
    manifest = read_manifest(path)
    head = manifest.step
    return Step(
        id=head.id,
        name=head.name,
        category=head.category,
        description=" ".join(head.description.split()),
        algorithm=head.algorithm,
        manifest_path=path,
        config_dir=root / "steps" / head.id,
        tags=tuple(head.tags),
        configs=tuple(head.configs),
        consumes=tuple(ArtifactSpec(**entry.model_dump()) for entry in manifest.consumes),
        produces=tuple(ArtifactSpec(**entry.model_dump()) for entry in manifest.produces),
        parameters=tuple(Parameter(**entry.model_dump()) for entry in manifest.parameters),
        strategies=tuple(manifest.strategies),
        errors=tuple(manifest.errors),
        resources=dict(manifest.resources),
        reference=dict(manifest.reference),
    )


def _check(catalog: Catalog) -> None:
    """Every type named exists, every is_a/convert_to target exists, every listed config file exists."""
    for t in catalog.types.values():
        for parent in t.is_a:
            if parent not in catalog.types:
                raise UsageError(f"types.toml: {t.name} is_a unknown type '{parent}'")
        for target, step_id in t.convert_to:
            if target not in catalog.types:
                raise UsageError(f"types.toml: {t.name} converts to unknown type '{target}' (via {step_id})")
    for step in catalog.steps.values():
        for spec in step.consumes + step.produces:
            if spec.type not in catalog.types:
                raise UsageError(f"{step.manifest_path}: {spec.name} has unknown artifact type '{spec.type}'")
        for name in step.configs:
            if not step.config_path(name).is_file():
                raise UsageError(f"{step.manifest_path}: config '{name}' not found at {step.config_path(name)}")
