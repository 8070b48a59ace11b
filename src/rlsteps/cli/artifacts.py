"""`rlsteps artifacts`: the artifact store's names, versions, metadata and lineage; publishing. Presentation only."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.text import Text

from rlsteps.cli import terminal

out = Console()
err = Console(stderr=True)

artifacts_app = typer.Typer(
    rich_markup_mode=None,
    no_args_is_help=True,
    help="The artifact store (artifacts: {root: DIR_OR_URL} in rlsteps.yaml): list, show, lineage, publish.",
)
REFERENCE = "NAME, NAME:vN or NAME:latest (artifact: in front is optional)."


def _store():
    from rlsteps.artifacts.store import ArtifactStore, store_root

    return ArtifactStore(store_root())


def _version(reference: str):
    from rlsteps.artifacts.store import SCHEME

    return _store().resolve(reference if reference.startswith(SCHEME) else SCHEME + reference)


@artifacts_app.command("list")
def list_artifacts(
    name: str | None = typer.Argument(None, help="Only this name's versions."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the names in the store, or one name's versions."""
    store = _store()
    versions = [v for n in ([name] if name else store.names()) for v in store.versions(n)]
    if as_json:
        out.print_json(json.dumps([{"artifact": v.label, "url": v.url, **v.metadata} for v in versions]))
        return
    if not versions:
        err.print(f"no artifacts{' named ' + name if name else ''} in {store.root}")
        return
    terminal.print_lines(out, version_lines(store.root, versions, out.width))


def version_lines(root: str, versions, width: int) -> list[Text]:
    """Each version as its label (never broken) and type, then, indented, where it came from, its size and content
    hash (its middle left out: `artifacts show` prints it whole, and its url: the store's root/NAME/vN)."""
    lines = terminal.heading(f"artifacts in {root}", width)
    lines += terminal.wrap(
        "each version in NAME/vN there; rlsteps artifacts show NAME:vN prints all of it", width, 4, 2
    )
    for v in versions:
        m = v.metadata
        lines += terminal.wrap(Text.assemble((v.label, "bold cyan"), "  ", str(m.get("type"))), width, 4, 0)
        producer = (m.get("producer") or {}).get("step") or "outside rlsteps"
        details = (
            f"from {producer}, created {str(m.get('created')).replace('T', ' ')}, "
            f"{m.get('size_bytes', 0) / 1e6:.1f} MB, {short_hash(str(m.get('content_hash', '')))}"
        )
        lines += terminal.wrap(Text(details, style="dim"), width, 4)
    return lines


def short_hash(content_hash: str, keep: int = 8) -> str:
    """sha256:0123abcd…6789cdef: the algorithm, the first and last `keep` digits."""
    algorithm, _, digits = content_hash.rpartition(":")
    shown = digits if len(digits) <= 2 * keep + 1 else f"{digits[:keep]}…{digits[-keep:]}"
    return f"{algorithm}:{shown}" if algorithm else shown


@artifacts_app.command("show")
def show_artifact(reference: str = typer.Argument(..., help=REFERENCE)) -> None:
    """Print a version's metadata (JSON); for an eval report, its table too."""
    version = _version(reference)
    out.print_json(json.dumps({"artifact": version.label, "url": version.url, **version.metadata}, default=str))
    if version.metadata.get("type") == "eval_report":
        import fsspec

        with fsspec.open(f"{version.url.rstrip('/')}/report.md", "r") as report:
            out.print(report.read(), highlight=False, markup=False, soft_wrap=True)


@artifacts_app.command("lineage")
def lineage(reference: str = typer.Argument(..., help=REFERENCE)) -> None:
    """The chain of inputs that produced a version, through every published input."""
    store = _store()
    lines = [
        wrapped
        for depth, line in store.lineage(_version(reference))
        for wrapped in terminal.wrap(line, out.width, 2 * depth + 4, 2 * depth)
    ]
    terminal.print_lines(out, lines)


@artifacts_app.command("publish")
def publish(
    path: str = typer.Argument(
        ...,
        help="The artifact to copy in: a path or an fsspec URL (a run's output, e.g. .rlsteps/runs/rl_rs-tiny/policy).",
    ),
    name: str = typer.Argument(..., help="The name to publish under; the next version number is taken."),
) -> None:
    """Copy an artifact into the store as NAME's next version (files first, the metadata last)."""
    from rlsteps.catalog import load_catalog

    version = _store().publish(load_catalog(), path, name)
    terminal.print_lines(out, terminal.wrap(f"published {version.label}: {version.url}", out.width, 4, 0))
