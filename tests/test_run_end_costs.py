"""What a run pays once, kept small: megatron-core imported without inductor, the plot drawn beside the output."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from rlsteps.engine.metrics import MetricsWriter, finish_plot, start_plot


def test_megatron_core_imports_without_torch_inductor_and_its_fusions_stay_plain_functions():
    pytest.importorskip("megatron.core")
    code = (
        "import sys, torch, torch._dynamo\n"
        "from rlsteps.engine.megatron.compat import import_megatron\n"
        "import_megatron('megatron.core.dist_checkpointing.strategies.filesystem_async')\n"
        "import megatron.core.jit as jit\n"
        "from megatron.core.fusions import fused_bias_geglu as g\n"
        "assert 'torch._inductor.compile_fx' not in sys.modules, 'inductor imported'\n"
        "assert torch.compile.__module__.startswith('torch'), torch.compile\n"
        "x = torch.randn(3, 4)\n"
        "y1, y2 = torch.chunk(x, 2, -1)\n"
        "expected = torch.nn.functional.gelu(y1, approximate='tanh') * y2\n"
        "assert torch.allclose(g.geglu(x), expected, atol=1e-6)  # the plain function, the same result\n"
        "print(jit.jit_fuser.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "_plain_decorator"


def test_the_plot_drawn_in_its_own_process_is_whole_and_a_failure_says_why(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as writer:
        for step in range(1, 6):
            writer.log(step, {"train/reward": math.sin(step)})
    out = tmp_path / "metrics.png"
    assert finish_plot(start_plot(path, out, ["train/reward", "val/reward_mean"]), out) == out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.png"]  # no staging file left
    with pytest.raises(ValueError, match="none of \\['val/reward_mean'\\] was logged"):
        finish_plot(start_plot(path, tmp_path / "none.png", ["val/reward_mean"]), tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
