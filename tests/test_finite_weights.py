"""A policy weight that is NaN or infinite stops the run where it is found, naming the tensor: before a checkpoint is
written, after one is read, and before the output is written (rlsteps.engine.checkpoints.finite)."""

from __future__ import annotations

import pytest
import torch

from rlsteps.engine.checkpoints.finite import NonFiniteWeights, first_non_finite, refuse_non_finite


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_finite_weights_pass():
    model = small_model()
    assert first_non_finite(model) is None
    refuse_non_finite(model, "after step 3, before its checkpoint", fix="lower train.lr")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_first_non_finite_tensor_is_named_with_when_and_the_fix(bad):
    model = small_model()
    with torch.no_grad():
        model[2].bias[1] = bad
    assert first_non_finite(model) == "2.bias"
    with pytest.raises(NonFiniteWeights) as refused:
        refuse_non_finite(model, "after step 3, before its checkpoint", fix="lower train.lr")
    assert str(refused.value) == (
        "the policy's weights are not finite after step 3, before its checkpoint: 2.bias holds NaN or infinity "
        "(fix: lower train.lr)"
    )
    assert refused.value.exit_code == 1
