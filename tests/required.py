"""Optional counterparts the tests import (leptonai, megatron-core, TRL): skipped where they are not installed, failed
where a switch says they must be there.

`importorskip(module, switch=NAME)` is pytest.importorskip, except that with RLSTEPS_REQUIRE_<NAME>=1 (CI sets every
switch, .ci/run) a missing or broken import fails the test, or the whole module at collection, instead of skipping
it: an extra that stops installing or importing turns CI red rather than leaving it green with tests unrun.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

SWITCHES = {  # switch -> what it requires (.ci/run sets RLSTEPS_REQUIRE_<switch>=1 for each)
    "LEPTON": "the leptonai SDK (rlsteps[lepton])",
    "MEGATRON": "megatron-core (rlsteps[megatron])",
    "TRL": "TRL (rlsteps[test])",
    "TMPFS": "a tmpfs the tests may mount (root): a real full disk",
    "UPSTREAM": "the pinned NeMo-RL and NeMo-Gym sources (../shared/upstream), and tests/prepare_oracles.sh",
    "TRITON": "PyTriton's environment, .venv-triton (tests/make_triton_env.sh)",
}


def variable(switch: str) -> str:
    return f"RLSTEPS_REQUIRE_{switch}"


def importorskip(module: str, *, switch: str, reason: str | None = None) -> ModuleType:
    """The imported module; otherwise a skip (of the module, at module level), or a failure under the switch."""
    if switch not in SWITCHES:
        raise ValueError(f"unknown switch {switch!r}: one of {', '.join(SWITCHES)}")
    try:
        return importlib.import_module(module)
    except ImportError as error:
        why = f"{reason or f'needs {SWITCHES[switch]}'}: cannot import {module} ({error})"
    unavailable(why, switch=switch)


def unavailable(why: str, *, switch: str) -> None:
    """Skip (the module, at module level) for `why`; fail instead under the switch."""
    if os.environ.get(variable(switch)) == "1":
        pytest.fail(f"{why} ({variable(switch)}=1)", pytrace=False)
    pytest.skip(why, allow_module_level=True)
