"""metrics.png: titled, with the RL health panels a recipe logs, on plain axes (no offset where a value is flat)."""

import json

from matplotlib.figure import Figure

from rlsteps.engine.records.plot import _expand, _panel, flat_span, plot_metrics
from rlsteps.engine.records.run_end import HEALTH, plot_title


def test_a_flat_series_is_drawn_around_its_value_with_plain_ticks_and_no_offset():
    axes = Figure().subplots()
    _panel(axes, "train/reward", [1, 2, 3], [4.9990, 4.9992, 4.9991])
    formatter = axes.yaxis.get_major_formatter()
    ticks = axes.get_yticks()
    formatter.set_locs(ticks)
    assert formatter.get_offset() == ""  # no "+4.999" above the axis
    assert min(b - a for a, b in zip(ticks, ticks[1:])) >= 0.05  # not ticks of 0.0005 in the rounding noise
    assert all("e" not in formatter(t) for t in ticks)
    assert flat_span([0.0, 0.0]) == (-1.0, 1.0)
    assert flat_span([0.1, 0.3]) is None  # a series that moves keeps matplotlib's limits


def test_the_health_panels_and_each_reward_terms_mean_are_plotted_where_logged():
    logged = {"train/init_policy_kl", "train/entropy", "reward/rm", "reward/short", "reward/short/clipped"}
    keys = _expand(["train/reward", *HEALTH], logged)
    assert keys == [
        "train/reward",
        "train/init_policy_kl",
        "train/kl_mean",
        "train/entropy",
        "reward/rm",
        "reward/short",
    ]
    assert "reward/rm" not in _expand(["reward/*"], {"reward/rm"})  # one term: train/reward already shows it


def test_the_plot_is_titled_with_the_step_config_and_run_directory(tmp_path, monkeypatch):
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text("job:\n  step: rl/reinforce\n  config: tiny\n")
    monkeypatch.setenv("RLSTEPS_EXIT_FILE", str(job / "exit_code"))
    run_dir = tmp_path / "runs" / "rl_reinforce-tiny"
    assert plot_title(run_dir) == f"rl/reinforce -c tiny: {run_dir}"
    monkeypatch.delenv("RLSTEPS_EXIT_FILE")
    assert plot_title(run_dir) == f"rl_reinforce-tiny: {run_dir}"

    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "train/reward": 1.0 + s, "train/entropy": 1.2} for s in range(1, 4)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn = {}
    monkeypatch.setattr(Figure, "savefig", lambda figure, path, **kw: drawn.update(figure=figure) or path.touch())
    plot_metrics(metrics, tmp_path / "metrics.png", ["train/reward", *HEALTH], title="rl/reinforce -c tiny: x")
    assert drawn["figure"].get_suptitle() == "rl/reinforce -c tiny: x"
    assert [ax.get_title() for ax in drawn["figure"].axes if ax.get_visible()] == ["train/reward", "train/entropy"]
