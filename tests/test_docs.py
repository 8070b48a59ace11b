"""The docs cannot drift from the code: README.md and docs/*.md are held to what the command line does.

- README.md stays short, and every relative link in it and in docs/ names a file that exists.
- Every command in a ```bash block of docs/ and of README.md (but the two set-up commands at its top, which CI runs
  itself) goes through the real command line in a new folder outside the checkout, with no profile file of its own
  (the shipped example profiles and pipelines are found by name, as a user finds them), and exits as the page
  says: 0, or the N of a `# exits N` after it. A run (`run`, `steps run`, `pipeline run`) goes as a dry run: it
  compiles and checks everything and sends nothing. A bash block holds rlsteps commands only, so a new kind
  of command cannot slip in untested.
- A yaml block that a page introduces with `<!-- file: PATH -->` is that shipped file, byte for byte.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from cli_helpers import invoke

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150
SET_UP = "python3 -m venv"  # README's two first commands: CI runs the second; the tiny run of the first runs below
RUNS = (("run",), ("steps", "run"), ("pipeline", "run"))


def bash_blocks(page: Path) -> list[str]:
    return re.findall(r"^ *```bash\n(.*?)\n *```", page.read_text(), flags=re.MULTILINE | re.DOTALL)


def commands(page: Path) -> list[str]:
    """The commands of the page's bash blocks: continuation lines joined, blank lines dropped."""
    found = []
    for block in bash_blocks(page):
        for command in re.sub(r"\\\n\s*", " ", block).splitlines():
            if command.strip() and not command.startswith(SET_UP):
                found.append(command.strip())
    return found


DOCUMENTED = [(page.relative_to(ROOT).as_posix(), command) for page in PAGES for command in commands(page)]


def parse(command: str) -> tuple[dict[str, str], list[str], int]:
    """(environment assignments, rlsteps' arguments, the exit code the page gives it)."""
    text, _, comment = command.partition(" #")
    expected = re.search(r"exits (\d+)", comment)
    words = shlex.split(text)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[:1] == ["rlsteps"], f"docs run rlsteps commands only (or teach this test another): {command}"
    return env, words[1:], int(expected.group(1)) if expected else 0


@pytest.fixture
def project(tmp_path, monkeypatch, tiny_world):
    """A new folder outside the checkout, as a user's first one: no rlsteps.yaml, no profiles of the user's own.
    Only examples/ is copied, for the page that still runs an example pipeline by its path (docs/evaluation.md)."""
    assert ROOT not in tmp_path.parents
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLSTEPS_PROFILES", raising=False)
    return tmp_path


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES
    first_two = bash_blocks(ROOT / "README.md")[:2]
    assert all(c.startswith(SET_UP) for c in first_two)
    assert first_two[0].endswith("rlsteps run rl/rs -c tiny")
    assert re.search(r"&& python -m pytest( -n 2 --dist loadgroup)?( -m 'not long')?$", first_two[1]), first_two[1]


def test_every_relative_link_names_a_file_that_exists():
    broken = []
    for page in PAGES:
        text = page.read_text()
        targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + re.findall(r'<img src="([^"]+)"', text)
        for target in targets:
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in readme] == []


@pytest.mark.parametrize(("page", "command"), DOCUMENTED, ids=[f"{p}: {c[:60]}" for p, c in DOCUMENTED])
def test_the_documented_command_works(page, command, project, monkeypatch):
    env, argv, expected = parse(command)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # as a user reads the page: online (a dry run never fetches)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if any(tuple(argv[: len(run)]) == run for run in RUNS) and not {"--dry-run", "-d"} & set(argv):
        argv = [*argv, "--dry-run"]
    result = invoke(*argv)
    assert result.exit_code == expected, f"{page}: {command}\n{result.output[-3000:]}"


def test_there_are_documented_commands_on_every_topic():
    pages_with_commands = {page for page, _ in DOCUMENTED}
    assert {"README.md", "docs/steps-and-configs.md", "docs/pipelines-and-artifacts.md"} <= pages_with_commands
    assert len(DOCUMENTED) >= 15


def test_a_quoted_file_is_the_shipped_file():
    quoted = 0
    for page in PAGES:
        for path, body in re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", page.read_text(), flags=re.DOTALL):
            assert body == (ROOT / path).read_text(), f"{page.relative_to(ROOT)} quotes {path} as it no longer is"
            quoted += 1
    assert quoted >= 1
