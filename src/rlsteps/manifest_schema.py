"""The schema of a step manifest (manifests/**/<step>.toml) and of types.toml, and the reading of either file: every
key checked by name and type (an unknown or misspelt key is refused, never ignored), every failure one UsageError
naming the file, the key and the fix. A file that is not a regular file (a FIFO, a folder named x.toml) is refused
before it is opened, so nothing blocks on it.
"""

from __future__ import annotations

import difflib
import stat
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from rlsteps.errors import UsageError

MANIFEST_FIX = "see any manifest that rlsteps ships (rlsteps show STEP --json lists its fields)"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class StepHead(_Strict):
    id: StrictStr = Field(pattern=r"^[\w.-]+(/[\w.-]+)+$")  # category/name, as rl/rs
    name: StrictStr
    category: StrictStr
    description: StrictStr
    algorithm: StrictStr
    tags: list[StrictStr] = []
    configs: list[StrictStr] = []


class ArtifactEntry(_Strict):
    name: StrictStr
    type: StrictStr
    key: StrictStr
    description: StrictStr = ""
    required: StrictBool = True
    required_unless: StrictStr | None = None
    reward_source: StrictStr | None = None
    type_key: StrictStr | None = None
    hub_id: StrictBool = False


class ParameterEntry(_Strict):
    name: StrictStr
    description: StrictStr
    default: Any = None


class Manifest(_Strict):
    step: StepHead
    consumes: list[ArtifactEntry] = []
    produces: list[ArtifactEntry] = []
    parameters: list[ParameterEntry] = []
    strategies: list[dict[str, StrictStr]] = []
    errors: list[dict[str, StrictStr]] = []
    resources: dict[str, Any] = {}
    reference: dict[str, Any] = {}


class TypeEntry(_Strict):
    description: StrictStr = ""
    is_a: list[StrictStr] = []
    convert_to: list[Annotated[list[StrictStr], Field(min_length=2, max_length=2)]] = []  # [target type, step]
    abstract: StrictBool = False
    detect: StrictStr | None = None


class TypesFile(_Strict):
    types: dict[str, TypeEntry] = {}


def read_manifest(path: Path) -> Manifest:
    return _validated(path, Manifest)


def read_types(path: Path) -> TypesFile:
    return _validated(path, TypesFile)


def _validated(path: Path, schema: type[_Strict]) -> Any:
    try:
        return schema.model_validate(read_toml(path))
    except ValidationError as error:
        raise UsageError(f"{path}: {_first_problem(error, schema)}", fix=MANIFEST_FIX) from None


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's table; UsageError naming the file for one that is not a regular file, not UTF-8 or not TOML."""
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise UsageError(f"{path}: {kind}, not a TOML file", fix="rename or remove it")
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise UsageError(f"{path}: not UTF-8 text (byte {error.start + 1})", fix="save it as UTF-8") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{path}: invalid TOML: {error}", fix="correct the TOML syntax at that line") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot be read: {error.strerror or error}", fix="check its permissions") from None


def _first_problem(error: ValidationError, schema: type[BaseModel]) -> str:
    problem = error.errors()[0]
    where = _key_path(problem["loc"])
    if problem["type"] == "extra_forbidden":
        known = _known_keys(schema, problem["loc"][:-1])
        close = difflib.get_close_matches(str(problem["loc"][-1]), known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(known)})" if known else ""
        return f"unknown key '{where}'{hint}"
    if problem["type"] == "missing":
        return f"'{where}' is missing"
    return f"'{where}': {problem['msg'].lower()}, got {problem['input']!r}"


def _key_path(loc: tuple) -> str:
    """pydantic's location as the TOML reader writes it: consumes[0].type, step.id."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _known_keys(schema: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the model at `loc` inside `schema` (lists and dicts stepped through), or []."""
    model: Any = schema
    for part in loc:
        if isinstance(part, int) or not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        model = next((a for a in getattr(annotation, "__args__", ()) if isinstance(a, type)), annotation)
    return sorted(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []
