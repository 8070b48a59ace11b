"""The rooms of src/rlsteps and the one-way arrows between them (docs/layout.md).

An import that runs against an arrow (the engine reaching into the command line, say) fails here,
whether it sits at the top of a module or inside a function.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rlsteps"

# room -> the rooms it may import from. errors, catalog and secrets are the shared vocabulary; dotted (keys of nested
# dicts) serves every room, and install (the version, the source, the catalog's folder) every room that records them.
ALLOWED = {
    "cli": {"plan", "artifacts", "launch", "engine", "catalog", "secrets", "errors", "dotted", "install"},
    "plan": {"artifacts", "launch", "tiny", "examples", "engine", "catalog", "secrets", "errors", "dotted", "install"},
    "artifacts": {"engine", "catalog", "errors", "dotted"},
    "launch": {"secrets", "errors", "engine", "dotted", "install"},  # the engine's torch-free job files (NeMo-RL's)
    "tiny": {"engine", "dotted"},
    "examples": {"tiny"},  # the examples' files and models, cached where the tiny world is
    "engine": {"dotted", "secrets", "errors", "install"},  # vocabulary: masking, exit codes, the code's version
    "catalog": {"errors", "dotted", "install"},
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


def test_readme_and_ci_run_the_same_test_command():
    readme = (SRC.parents[1] / "README.md").read_text()
    ci = (SRC.parents[1] / ".ci" / "run").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("python3 -m venv") and "pytest" in line]
    assert len(commands) == 1 and commands[0] in ci.splitlines()


# The engine's top level holds only the vocabulary its rooms share; everything else lives in a room (docs/layout.md).
ENGINE_VOCABULARY = {"__init__", "config", "batch", "distributed", "device"}
ENGINE_ROOMS = {
    "run", "inputs", "checkpoints", "records", "algorithms", "policy", "generation", "rewards", "megatron", "nemo_rl"
}  # fmt: skip


def test_the_engine_keeps_its_modules_in_rooms():
    engine = SRC / "engine"
    top = {p.stem for p in engine.glob("*.py")}
    rooms = {p.name for p in engine.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert (top, rooms) == (ENGINE_VOCABULARY, ENGINE_ROOMS)
    layout = (SRC.parents[1] / "docs" / "layout.md").read_text()
    assert [room for room in sorted(rooms) if f"| `{room}/` |" not in layout] == []
