"""What an artifact reference holds, by the catalog's types (the detectors are rlsteps.contract.detectors)."""

from __future__ import annotations

from rlsteps.catalog import Catalog
from rlsteps.contract.detectors import detect, exists

__all__ = ["detect_types", "detectors_of", "exists"]


def detectors_of(catalog: Catalog) -> dict[str, str | None]:
    """Every type of the catalog -> the name of its detector (None: known by its metadata file alone)."""
    return {t.name: t.detect for t in catalog.types.values()}


def detect_types(catalog: Catalog, ref: str) -> list[str]:
    """Every concrete type whose detector accepts the reference; a metadata file's declared type first."""
    return detect(ref, detectors_of(catalog))
