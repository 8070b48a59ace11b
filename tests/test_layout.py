"""The rooms of src/rlsteps and the one-way arrows between them (docs/layout.md).

An import that runs against an arrow (the engine reaching into the command line, say) fails here,
whether it sits at the top of a module or inside a function.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rlsteps"

# room -> the rooms it may import from. errors, catalog and secrets are the shared vocabulary; dotted (keys of nested
# dicts) serves every room, and install (the version, the source, the catalog's folder) every room that records them.
# The submitting side (cli, plan, launch, artifacts) meets the worker in contract alone: of the engine, only the
# command line's `serve` commands are imported (test_the_submitting_side_meets_the_engine_in_the_contract).
ALLOWED = {
    "cli": {"plan", "artifacts", "launch", "engine", "contract", "catalog", "secrets", "errors", "dotted", "install"},
    "plan": {
        "artifacts",
        "launch",
        "nemo_rl",
        "tiny",
        "examples",
        "contract",
        "catalog",
        "secrets",
        "errors",
        "dotted",
        "install",
    },  # fmt: skip
    "artifacts": {"contract", "catalog", "errors", "dotted"},
    "launch": {"nemo_rl", "contract", "secrets", "errors", "dotted", "install"},  # NeMo-RL's job files
    "nemo_rl": {"contract", "errors", "dotted"},  # the compile for NeMo-RL: a peer of plan, torch-free
    "tiny": {"engine", "contract", "dotted"},
    "examples": {"tiny"},  # the examples' files and models, cached where the tiny world is
    # rlsteps.run from Python: the command line's compile and checks, then the worker in the calling process
    "api": {"plan", "catalog", "contract", "engine", "errors"},
    "engine": {"contract", "dotted", "secrets", "errors", "install"},  # vocabulary: masking, exit codes, the version
    "contract": {"errors", "dotted"},  # torch-free: what submitting and running agree on
    "catalog": {"manifest_schema", "errors", "dotted", "install"},
    "manifest_schema": {"errors"},  # what a manifest and types.toml may hold
    "install": set(),  # this install: its version, its source, where its catalog lies
    "secrets": {"dotted"},
    "errors": {"secrets"},  # an error's message is masked
    "dotted": set(),
}


def _room(path: Path) -> str:
    relative = path.relative_to(SRC)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imported_rooms(path: Path) -> set[str]:
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [f"{node.module}.{a.name}" for a in node.names] if node.module == "rlsteps" else [node.module]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        rooms.update(m.split(".")[1] for m in modules if m.startswith("rlsteps."))
    return rooms


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _imported_modules(path: Path) -> set[str]:
    """The rlsteps modules a module imports, lazy imports included (`from pkg import module` names the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlsteps"):
            found.update(
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names
            )
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("rlsteps"))
    return {_owning_module(name) for name in found} - {_module_name(path)}


def _owning_module(name: str) -> str:
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def test_every_module_belongs_to_a_known_room():
    rooms = {_room(p) for p in SRC.rglob("*.py")} - {"__init__"}
    assert rooms == set(ALLOWED)


def test_imports_follow_the_arrows():
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        room = _room(path)
        if room == "__init__":
            continue
        for target in _imported_rooms(path) - ALLOWED[room] - {room}:
            wrong.append(f"{path.relative_to(SRC)} imports rlsteps.{target}")
    assert not wrong, "imports against the arrows:\n" + "\n".join(wrong)


def test_imports_are_absolute():
    """A relative import would slip past the arrow check above; the project writes none."""
    relative = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert relative == []


def test_the_arrows_have_no_cycle():
    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in ALLOWED[start])

    assert [room for room in ALLOWED if reaches(room, room)] == []


def test_no_module_imports_itself_around_a_cycle():
    """Module by module, lazy imports included: no chain of imports leads back to where it started."""
    graph = {name: _imported_modules(path) for name, path in MODULES.items()}
    cycles = [scc for scc in _strongly_connected(graph) if len(scc) > 1]
    assert cycles == []


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


# The ways through the seam, each a program's entry: the command line's `serve` commands (the servers' own commands)
# and the builders of the offline tiny world and the examples' models, which train or convert with torch before any
# job starts. A submitting module reaches the engine through these alone, by any chain of imports.
SERVE_ENTRIES = {"rlsteps.engine.rewards.judge.command", "rlsteps.engine.rewards.rm.command"}
BUILD_ENTRIES = {"rlsteps.tiny.build", "rlsteps.examples.smollm2"}
SUBMITTING_ROOMS = ("cli", "plan", "launch", "artifacts", "nemo_rl")


def _reachable_without_entries(start: str, entries: set[str]) -> dict[str, str]:
    """Every module reachable from `start` by imports (lazy ones included), not going through `entries`: each with
    the module that imports it, to print the chain."""
    came_from = {start: ""}
    frontier = [start]
    while frontier:
        name = frontier.pop()
        for target in _imported_modules(MODULES[name]):
            if target not in came_from and target not in entries:
                came_from[target] = name
                frontier.append(target)
    return came_from


def _chain(came_from: dict[str, str], end: str) -> str:
    chain = [end]
    while came_from[chain[-1]]:
        chain.append(came_from[chain[-1]])
    return " -> ".join(reversed(chain))


def test_the_submitting_side_meets_the_engine_in_the_contract():
    """cli, plan, launch, artifacts and the NeMo-RL compile reach no engine module by any chain of imports but
    through the named entries; and each entry is used."""
    submitting = [name for name in MODULES if name.split(".")[1:2] in ([room] for room in SUBMITTING_ROOMS)]
    entries = SERVE_ENTRIES | BUILD_ENTRIES
    reached = set()
    for name in submitting:
        came_from = _reachable_without_entries(name, entries)
        reached |= {_chain(came_from, target) for target in came_from if target.startswith("rlsteps.engine")}
    assert sorted(reached) == []
    used = {t for name in submitting for t in _reachable_without_entries(name, set()) if t in entries}
    assert used == entries


def test_the_programs_the_submitting_side_starts_are_the_engines_own():
    """The module names a launcher starts (contract.entry_points) are modules that run as programs."""
    from rlsteps.contract import entry_points

    programs = [entry_points.WORKER_MODULE, entry_points.NEMO_RL_STAGES_MODULE, *entry_points.SERVER_MODULES.values()]
    runnable = [name for name in programs if name in MODULES and (f"{name}.__main__" in MODULES or _has_main(name))]
    assert runnable == programs


def _has_main(name: str) -> bool:
    return '__name__ == "__main__"' in MODULES[name].read_text()


def test_the_contract_imports_no_heavy_package():
    """Torch-free, at the top and in every function: the submitting side may call any of it."""
    heavy = ("torch", "transformers", "megatron", "vllm", "peft", "safetensors", "numpy")
    found = [
        f"{name} imports {alias.name if isinstance(node, ast.Import) else node.module}"
        for name, path in MODULES.items()
        if name.startswith("rlsteps.contract")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [node])
        if (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0] in heavy
    ]
    assert found == []


def test_readme_and_ci_run_the_same_test_command():
    readme = (SRC.parents[1] / "README.md").read_text()
    ci = (SRC.parents[1] / ".ci" / "run").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("python3 -m venv") and "pytest" in line]
    assert len(commands) == 1 and commands[0] in ci.splitlines()


# The engine's top level holds only the vocabulary its rooms share; everything else lives in a room (docs/layout.md).
ENGINE_VOCABULARY = {"__init__", "batch", "distributed", "device", "call_site"}
ENGINE_ROOMS = {
    "run", "inputs", "checkpoints", "records", "algorithms", "policy", "generation", "rewards", "megatron",
    "nemo_rl_stages", "eval",
}  # fmt: skip
ENGINE_ROOM_NAMES = {f"rlsteps.engine.{room}" for room in ENGINE_ROOMS}


def test_the_engine_keeps_its_modules_in_rooms():
    engine = SRC / "engine"
    top = {p.stem for p in engine.glob("*.py")}
    rooms = {p.name for p in engine.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert (top, rooms) == (ENGINE_VOCABULARY, ENGINE_ROOMS)
    layout = (SRC.parents[1] / "docs" / "layout.md").read_text()
    assert [room for room in sorted(rooms) if f"| `{room}/` |" not in layout] == []


def test_the_engines_vocabulary_reaches_into_none_of_its_rooms():
    """The engine's top level (batch, distributed, device) is what its rooms share: an import of a room from it would
    be an arrow back up the house."""
    upward = [
        f"{name} -> {target}"
        for name in MODULES
        if name.count(".") == 2 and name.startswith("rlsteps.engine.") and name not in ENGINE_ROOM_NAMES
        for target in _imported_modules(MODULES[name])
        if any(target == room or target.startswith(room + ".") for room in ENGINE_ROOM_NAMES)
    ]
    assert upward == []
