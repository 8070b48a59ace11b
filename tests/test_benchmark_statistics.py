"""The statistics the benchmarks report, on hand-computed examples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from trl_verifiable import paired_change  # noqa: E402


def test_the_paired_change_counts_gains_and_losses_and_its_sign_test():
    before = [False, False, False, True, True, False]
    after = [True, True, False, False, True, True]  # 3 gained, 1 lost, 2 unchanged
    change = paired_change(before, after)
    assert (change["gained"], change["lost"]) == (3, 1)
    assert change["sign_p"] == pytest.approx(5 / 16)  # P(at least 3 heads of 4 fair coins): (4 + 1) / 16
    assert paired_change([True], [True]) == {"gained": 0, "lost": 0, "sign_p": 1.0}  # nothing changed
    assert paired_change([False] * 11, [True] * 11)["sign_p"] == pytest.approx(2**-11)
