"""Pipelines end to end on the tiny world: three stages chained and published, skipped when unchanged, resumed
after a failure."""

import json
import shutil

import pytest
import torch

from cli_helpers import REPO
from rlsteps.contract.artifact import fingerprint
from run_helpers import rlsteps, weights

pytestmark = pytest.mark.slow

OUTPUTS = ".rlsteps/pipelines/{pipeline}/{stage}/policy"


def published_example(cwd):
    """The shipped example with each stage published to a store under cwd."""
    text = (REPO / "examples" / "pipelines" / "tiny.yaml").read_text()
    for stage in ("rs", "reinforce", "rlhf"):
        text = text.replace(f"  - name: {stage}\n", f"  - name: {stage}\n    publish: tiny-{stage}\n")
    (cwd / "p.yaml").write_text(text)
    (cwd / "rlsteps.yaml").write_text("artifacts:\n  root: store\n")
    return cwd / "p.yaml"


def test_three_stages_chain_publish_show_their_lineage_and_skip_when_unchanged(tiny_world, tmp_path):
    pipeline = published_example(tmp_path)
    done = rlsteps("pipeline", "run", str(pipeline), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(f"{stage}: ran (published tiny-{stage}:v1)" in done.stdout for stage in ("rs", "reinforce", "rlhf"))

    rs_out = tmp_path / OUTPUTS.format(pipeline="tiny", stage="rs")
    reinforce = json.loads(
        (tmp_path / OUTPUTS.format(pipeline="tiny", stage="reinforce") / "rlsteps_artifact.json").read_text()
    )
    assert reinforce["producer"]["step"] == "rl/reinforce" and reinforce["counters"]["step"] == 3
    assert reinforce["inputs"]["policy"] == OUTPUTS.format(pipeline="tiny", stage="rs")
    assert reinforce["input_versions"]["policy"] == fingerprint(str(rs_out))  # it read that very rs output

    lineage = rlsteps("artifacts", "lineage", "tiny-rlhf", cwd=tmp_path).stdout.splitlines()
    assert lineage[0].startswith("tiny-rlhf:v1 (checkpoint_megatron) from rl/rlhf")
    assert "  policy <- tiny-reinforce:v1" in lineage
    assert "      policy <- tiny-rs:v1" in lineage
    assert any(
        line.startswith("          policy <- ") and line.endswith(")") and str(tiny_world.policy_megatron) in line
        for line in lineage
    )

    again = rlsteps("pipeline", "run", str(pipeline), cwd=tmp_path, timeout=60)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipped (output exists, same config and inputs)") == 3
    assert "published" not in again.stdout and len(list((tmp_path / "store" / "tiny-rs").iterdir())) == 1

    changed = rlsteps(
        "pipeline", "run", str(pipeline), "--dry-run", "reinforce:train.lr=1e-5", cwd=tmp_path, timeout=60
    )
    assert "stage rs: skip" in changed.stdout
    assert "stage reinforce: run (the config changed)" in changed.stdout
    assert "stage rlhf: run (an upstream stage runs first)" in changed.stdout


def test_a_failed_stage_stops_the_pipeline_and_the_rerun_resumes_at_it(tiny_world, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    # line 2 is well formed but longer than the tiny configs' 64 prompt tokens: the stage's worker refuses it (exit 3)
    prompts.write_text('{"prompt": "Describe the cat."}\n' + json.dumps({"prompt": "Describe the dog. " * 40}) + "\n")
    (tmp_path / "p.yaml").write_text(f"""
name: two
overrides: [train.max_steps=2, validation.interval=0, run.num_threads=1]
stages:
  - {{name: rs, step: rl/rs, config: tiny}}
  - {{name: reinforce, step: rl/reinforce, config: tiny, inputs: {{policy: "stage:rs", prompts: "{prompts}"}}}}
""")
    failed = rlsteps("pipeline", "run", "p.yaml", cwd=tmp_path)
    assert failed.returncode == 3, failed.stderr[-3000:]  # an input the stage's own check refused
    assert "pipeline two stopped at stage 'reinforce'" in failed.stderr and "rerun the same command" in failed.stderr
    assert (tmp_path / OUTPUTS.format(pipeline="two", stage="rs") / "rlsteps_artifact.json").is_file()
    assert not (tmp_path / OUTPUTS.format(pipeline="two", stage="reinforce")).exists()

    prompts.write_text(
        "".join(f'{{"prompt": "Describe the {noun}."}}\n' for noun in ("cat", "dog", "castle", "lake") * 4)
    )
    resumed = rlsteps("pipeline", "run", "p.yaml", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rs: skipped" in resumed.stdout and "reinforce: ran" in resumed.stdout
    assert (tmp_path / OUTPUTS.format(pipeline="two", stage="reinforce") / "rlsteps_artifact.json").is_file()


def test_a_needed_conversion_runs_as_a_real_convert_stage_before_the_step(tiny_world, tmp_path, monkeypatch):
    """A catalog whose rl/rs takes only checkpoint_megatron, given the Hugging Face policy, with convert: true."""
    root = tmp_path / "catalog"
    shutil.copytree(REPO / "manifests", root / "manifests")
    shutil.copytree(REPO / "steps", root / "steps")
    rs = root / "manifests" / "rl" / "rs.toml"
    rs.write_text(
        rs.read_text().replace(
            'type = "checkpoint"\nkey = "inputs.policy"', 'type = "checkpoint_megatron"\nkey = "inputs.policy"'
        )
    )
    monkeypatch.setenv("RLSTEPS_ROOT", str(root))
    (tmp_path / "p.yaml").write_text(f"""
name: conv
convert: true
overrides: [train.max_steps=2, validation.interval=0, run.num_threads=1]
stages:
  - {{name: rs, step: rl/rs, config: tiny, inputs: {{policy: "{tiny_world.policy}"}}}}
""")
    done = rlsteps("pipeline", "run", str(tmp_path / "p.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rs-convert-policy: ran" in done.stdout and "rs: ran" in done.stdout
    converted = tmp_path / OUTPUTS.format(pipeline="conv", stage="rs-convert-policy")
    assert json.loads((converted / "rlsteps_artifact.json").read_text())["type"] == "checkpoint_megatron"
    from rlsteps.engine.policy.model import load_policy

    expected, got = load_policy(tiny_world.policy)[0].state_dict(), weights(converted)
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    rs_meta = json.loads((tmp_path / OUTPUTS.format(pipeline="conv", stage="rs") / "rlsteps_artifact.json").read_text())
    assert rs_meta["inputs"]["policy"] == OUTPUTS.format(pipeline="conv", stage="rs-convert-policy")
