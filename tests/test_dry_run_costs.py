"""What a dry run costs: nothing written, downloaded or heavy imported, for every config rlsteps ships."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_judge import vllm_python


@pytest.mark.parametrize("environment", ["main", "vllm"])
def test_a_dry_run_of_every_shipped_config_writes_downloads_and_imports_nothing_heavy(tmp_path, environment):
    """Every step and config the catalog ships, dry-run in one process with an empty home, cache and working folder,
    the Hub offline: no torch or transformers imported, no file written anywhere under them (the example model is
    built before a real run, never by its dry run), each answered with 0 or a one-line refusal. In the main
    environment and in the vLLM one, which holds the verifiable example's wheel (there a dry run dequantised
    SmolLM2 into the cache: 540 MB)."""
    python = sys.executable if environment == "main" else vllm_python()
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    code = (
        "import sys, io, contextlib, json\n"
        "from rlsteps.catalog import load_catalog\n"
        "from rlsteps.cli import main\n"
        "codes = {}\n"
        "for step in load_catalog().steps.values():\n"
        "    for config in step.configs:\n"
        "        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "            codes[f'{step.id} -c {config}'] = main(['run', step.id, '-c', config, '--dry-run'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'megatron.core') if m in sys.modules]\n"
        "print(json.dumps({'codes': codes, 'heavy': heavy}))\n"
    )
    env = {**os.environ, "HOME": str(home), "RLSTEPS_HOME": str(home / "rlsteps"), "HF_HOME": str(home / "hf"),
           "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(home / "cache")}  # fmt: skip
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=work, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["heavy"] == [], found
    assert len(found["codes"]) >= 15 and all(c in (0, 2, 3, None) for c in found["codes"].values()), found["codes"]
    assert list(home.rglob("*")) == [] and list(work.rglob("*")) == []
