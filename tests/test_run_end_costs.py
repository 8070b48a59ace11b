"""What a run pays once, kept small: megatron-core imported without inductor, the plot drawn beside the output by a
process started ahead."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

import required
from rlsteps.engine.records.metrics import MetricsWriter
from rlsteps.engine.records.plot import PlotProcess


@pytest.mark.slow  # megatron-core imported in a process of its own
def test_megatron_core_imports_without_torch_inductor_and_its_fusions_stay_plain_functions():
    required.importorskip("megatron.core", switch="MEGATRON")
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


def _metrics(path, steps):
    with MetricsWriter(path) as writer:
        for step in steps:
            writer.log(step, {"train/reward": math.sin(step)})


def test_the_plot_drawn_in_its_own_process_is_whole_and_a_failure_says_why(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _metrics(path, range(1, 6))
    out = tmp_path / "metrics.png"
    with PlotProcess(path, out, ["train/reward", "val/reward_mean"]) as plot:
        assert plot.draw() == out  # started by draw itself when nobody started it ahead
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.png"]  # no staging file left
    with pytest.raises(ValueError, match="none of \\['val/reward_mean'\\] was logged"):
        PlotProcess(path, tmp_path / "none.png", ["val/reward_mean"]).draw()
    assert not (tmp_path / "none.png").exists()


def test_a_plot_started_ahead_waits_for_its_cue_and_draws_the_metrics_as_they_are_then(tmp_path):
    path, out = tmp_path / "metrics.jsonl", tmp_path / "metrics.png"
    _metrics(path, range(1, 3))
    with PlotProcess(path, out, ["train/reward"]) as plot:
        plot.start()
        plot.start()  # once
        time.sleep(3)  # matplotlib imported by now on a quiet machine; either way nothing is drawn before the cue
        assert plot.process.poll() is None and not out.exists()
        _metrics(path, range(3, 6))  # the last steps, logged after the process started
        plot.cue()  # it draws now; the caller goes on
        plot.cue()  # once
        assert plot.draw() == out
    assert out.stat().st_size > 5000
    # the plot is of the five steps: drawn from the file as it was at the cue (the same PNG as one drawn from it now)
    again = tmp_path / "again.png"
    assert PlotProcess(path, again, ["train/reward"]).draw() == again
    assert again.read_bytes() == out.read_bytes()


def test_a_plot_let_go_draws_nothing_and_its_process_ends_even_when_the_run_dies_without_a_word(tmp_path):
    path, out = tmp_path / "metrics.jsonl", tmp_path / "metrics.png"
    _metrics(path, range(1, 4))
    plot = PlotProcess(path, out, ["train/reward"])
    plot.cancel()  # never started: nothing to stop
    plot.start()
    plot.cancel()
    assert plot.process.returncode is not None and not out.exists()
    # a run killed outright (no cancel, no exit handler): its plotting process sees its stdin close and exits
    code = (
        "import os, sys\n"
        "from rlsteps.engine.records.plot import PlotProcess\n"
        f"plot = PlotProcess({str(path)!r}, {str(out)!r}, ['train/reward'])\n"
        "plot.start()\n"
        "print(plot.process.pid, flush=True)\n"
        "os._exit(9)\n"
    )
    died = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert died.returncode == 9, died.stderr
    orphan = int(died.stdout.strip())
    deadline = time.monotonic() + 60
    while _alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(orphan), "the plotting process outlived its run"
    assert not out.exists()


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, reaped by init in its time, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.slow  # megatron-core imported in a process of its own
def test_a_megatron_checkpoint_is_written_without_forking_and_reads_back_bit_for_bit(tmp_path):
    required.importorskip("megatron.core", switch="MEGATRON")
    code = (
        "import os, sys, torch\n"
        "from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast\n"
        "from tokenizers import Tokenizer, models\n"
        "from rlsteps.engine.megatron.format import load_megatron_checkpoint, save_megatron_checkpoint\n"
        "torch.manual_seed(0)\n"
        "cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,\n"
        "                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)\n"
        "model = LlamaForCausalLM(cfg)\n"
        "tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({'a': 0, '[UNK]': 1}, '[UNK]')))\n"
        "def no_fork(): raise AssertionError('forked')\n"
        "os.fork = no_fork\n"
        f"save_megatron_checkpoint(model, tok, {str(tmp_path / 'ckpt')!r})\n"
        f"loaded, _ = load_megatron_checkpoint({str(tmp_path / 'ckpt')!r}, 'cpu', torch.float32)\n"
        "assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())\n"
    )
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
