"""A counterpart that is missing or broken fails the tests that need it under its RLSTEPS_REQUIRE_* switch, which CI
sets, instead of skipping them; every skip in tests/ has such a switch.

Each run here is pytest in a process of its own, with the counterpart made unimportable: a package of the same name,
first on PYTHONPATH, whose import raises ImportError.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import required

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
BROKEN = "ImportError('a broken install, made for this test')"
MODULES = {"LEPTON": "leptonai", "MEGATRON": "megatron.core", "TRL": "trl"}


def broken(root: Path, module: str) -> Path:
    """A folder that, first on PYTHONPATH, makes `import module` raise ImportError."""
    package = root / "broken" / module.split(".")[0]
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise {BROKEN}\n")
    return package.parent


def pytest_run(*args: str, shadow: Path, switch: str | None, cwd: Path) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if not name.startswith("RLSTEPS_REQUIRE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), str(TESTS), env.get("PYTHONPATH", "")])
    if switch:
        env[required.variable(switch)] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def summary(done: subprocess.CompletedProcess) -> str:
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr


MODULE_LEVEL = """\
import required

required.importorskip({module!r}, switch={switch!r})


def test_it():
    pass
"""
IN_A_FIXTURE = """\
import pytest

import required


@pytest.fixture
def counterpart():
    return required.importorskip({module!r}, switch={switch!r})


def test_it(counterpart):
    pass
"""


@pytest.mark.parametrize("switch", sorted(MODULES))  # the switches that stand for an import
def test_a_broken_counterpart_fails_under_its_switch_and_skips_without_it(tmp_path, switch):
    """At module level (the module's collection) and in a fixture (the test that uses it)."""
    module = MODULES[switch]
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for name, text in (("test_module_level.py", MODULE_LEVEL), ("test_in_a_fixture.py", IN_A_FIXTURE)):
        (tmp_path / name).write_text(text.format(module=module, switch=switch))
    shadow = broken(tmp_path, module)
    args = ("--continue-on-collection-errors", "test_module_level.py", "test_in_a_fixture.py")

    skipped = pytest_run(*args, shadow=shadow, switch=None, cwd=tmp_path)
    assert skipped.returncode == 0 and re.fullmatch(r"=+ 2 skipped in .*", summary(skipped)), skipped.stdout

    failed = pytest_run(*args, shadow=shadow, switch=switch, cwd=tmp_path)
    assert failed.returncode == 1 and re.fullmatch(r"=+ 2 errors in .*", summary(failed)), failed.stdout
    assert failed.stdout.count(f"a broken install, made for this test) ({required.variable(switch)}=1)") >= 2


@pytest.mark.parametrize(
    ("test_file", "switch"), [("test_launch_lepton.py", "LEPTON"), ("test_megatron_format.py", "MEGATRON")]
)
@pytest.mark.slow  # pytest in processes of its own, one per counterpart
def test_the_real_modules_that_need_a_counterpart_fail_under_its_switch_when_it_is_broken(tmp_path, test_file, switch):
    shadow = broken(tmp_path, MODULES[switch])
    path = str(TESTS / test_file)
    skipped = pytest_run("--collect-only", "-q", path, shadow=shadow, switch=None, cwd=REPO)
    assert skipped.returncode == 5 and "SKIPPED [1]" in skipped.stdout and "error" not in skipped.stdout, skipped.stdout
    failed = pytest_run("--collect-only", "-q", path, shadow=shadow, switch=switch, cwd=REPO)
    assert failed.returncode == 2 and "1 error" in summary(failed), failed.stdout
    assert f"({required.variable(switch)}=1)" in failed.stdout


def _calls(tree: ast.AST) -> list[str]:
    """The dotted names of the calls and decorators in a module: pytest.importorskip, pytest.mark.skipif, ..."""
    names = []
    for node in ast.walk(tree):
        target = node.func if isinstance(node, ast.Call) else node
        parts = []
        while isinstance(target, ast.Attribute):
            parts.append(target.attr)
            target = target.value
        if isinstance(target, ast.Name) and parts:
            names.append(".".join([target.id, *reversed(parts)]))
    return names


def test_every_skip_in_the_tests_has_a_require_switch_and_ci_sets_every_switch():
    """pytest.importorskip only through required.importorskip; pytest.skip and skipif only in a module that names the
    RLSTEPS_REQUIRE_* variable that turns them into failures; .ci/run sets every such variable to 1."""
    unswitched, named = [], set()
    for path in sorted(TESTS.glob("*.py")):
        text = path.read_text()
        calls = set(_calls(ast.parse(text)))
        if path.name != "required.py" and "pytest.importorskip" in calls:
            unswitched.append(f"{path.name}: pytest.importorskip (use required.importorskip)")
        if calls & {"pytest.skip", "pytest.mark.skipif"} and path.name != "required.py":
            variables = set(re.findall(r"RLSTEPS_REQUIRE_[A-Z]+", text))
            if not variables:
                unswitched.append(f"{path.name}: a skip without an RLSTEPS_REQUIRE_* switch")
            named |= variables
    assert not unswitched, unswitched
    named |= {required.variable(switch) for switch in required.SWITCHES}
    ci = (REPO / ".ci" / "run").read_text()
    unset = sorted(name for name in named if not re.search(rf"^export {name}=1\b", ci, re.MULTILINE))
    assert not unset, f".ci/run does not set {', '.join(unset)}=1"
