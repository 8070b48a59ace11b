import os
from pathlib import Path

import pytest

from rlsteps.catalog import load_catalog
from rlsteps.errors import UsageError
from rlsteps.plan.profiles import profile_files, resolve_profile
from rlsteps.plan.runner import RunRequest, compile_request

EXAMPLES = Path(__file__).resolve().parents[1] / "profiles"


def test_lookup_order_cwd_then_env_then_home(tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    (home / ".config" / "rlsteps").mkdir(parents=True)
    cwd.mkdir()
    (home / ".config" / "rlsteps" / "profiles.yaml").write_text(
        "profiles:\n  p: {executor: local, where: home}\n  h: {executor: local}\n"
    )
    env_file = tmp_path / "env.yaml"
    env_file.write_text("profiles:\n  p: {executor: local, where: env}\n  e: {executor: local}\n")
    (cwd / "rlsteps.yaml").write_text("profiles:\n  p: {executor: local, where: cwd}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RLSTEPS_PROFILES", str(env_file))
    monkeypatch.chdir(cwd)
    assert profile_files() == [cwd / "rlsteps.yaml", env_file, home / ".config" / "rlsteps" / "profiles.yaml"]
    assert resolve_profile("p").settings["where"] == "cwd"
    assert resolve_profile("e").source == str(env_file)
    assert resolve_profile("h").executor == "local"


def test_rlsteps_profiles_takes_files_and_folders_separated_like_path_the_first_winning(tmp_path, monkeypatch):
    folder, single = tmp_path / "team", tmp_path / "mine.yaml"
    folder.mkdir()
    (folder / "b.yaml").write_text("profiles:\n  p: {executor: local, where: team-b}\n  t: {executor: local}\n")
    (folder / "a.yaml").write_text("profiles:\n  p: {executor: local, where: team-a}\n")
    (folder / "notes.txt").write_text("not a profile file\n")
    single.write_text("profiles:\n  p: {executor: local, where: mine}\n  m: {executor: local}\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", os.pathsep.join([str(folder), str(single)]))
    assert profile_files() == [folder / "a.yaml", folder / "b.yaml", single]
    assert resolve_profile("p").settings["where"] == "team-a"  # a folder's files in name order, before what follows
    assert resolve_profile("m").source == str(single) and resolve_profile("t").source == str(folder / "b.yaml")
    monkeypatch.setenv("RLSTEPS_PROFILES", os.pathsep.join([str(single), str(folder)]))
    assert resolve_profile("p").settings["where"] == "mine"


def test_an_unknown_profile_names_a_profiles_entry_that_does_not_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLSTEPS_PROFILES", str(tmp_path / "typo.yaml"))
    with pytest.raises(UsageError) as refused:
        resolve_profile("team_cluster")
    assert f"$RLSTEPS_PROFILES names {tmp_path / 'typo.yaml'}, not found" in refused.value.fix


def test_the_shipped_example_profiles_are_read_after_the_users_own_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RLSTEPS_PROFILES", raising=False)
    assert profile_files() == [] and resolve_profile("my_slurm").source == str(EXAMPLES / "slurm.yaml")
    assert resolve_profile("my_lepton").executor == "lepton"
    (tmp_path / "rlsteps.yaml").write_text("profiles:\n  my_slurm: {executor: slurm, account: mine}\n")
    assert resolve_profile("my_slurm").settings == {"executor": "slurm", "account": "mine"}  # the user's wins
    assert resolve_profile("my_slurm_2nodes").settings["account"] == "mine"  # an example extends the user's


def test_an_unknown_profile_names_every_known_profile_and_the_files_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "rlsteps.yaml").write_text("profiles:\n  team: {executor: local}\n")
    with pytest.raises(UsageError) as refused:
        resolve_profile("zzz")
    fix = refused.value.fix
    assert "use one of " in fix and "my_slurm" in fix and "team" in fix and "local" in fix
    assert str(tmp_path / "rlsteps.yaml") in fix and str(EXAMPLES / "lepton.yaml") in fix


def test_the_shipped_example_profiles_folder_is_a_profiles_entry(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(EXAMPLES))
    assert resolve_profile("slurm_rl_nemo_rl_rlhf").executor == "slurm"
    assert resolve_profile("my_lepton_2nodes").settings["nodes"] == 2


def test_extends_merges_parent_first(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("profiles:\n  a: {executor: slurm, nodes: 1, time: '01:00:00'}\n  b: {extends: a, nodes: 4}\n")
    profile = resolve_profile("b", [f])
    assert profile.settings == {"executor": "slurm", "nodes": 4, "time": "01:00:00"}


def test_extends_cycle_and_unknown_profiles_are_errors(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("profiles:\n  a: {extends: b}\n  b: {extends: a}\n  slurm_big: {executor: slurm}\n")
    with pytest.raises(UsageError, match="extends itself"):
        resolve_profile("a", [f])
    with pytest.raises(UsageError) as err:
        resolve_profile("slurm_bigg", [f])
    assert "slurm_big" in err.value.fix


def test_local_is_built_in_and_a_file_may_redefine_it(tmp_path):
    assert resolve_profile("local", []).settings == {"executor": "local"}
    assert resolve_profile("local", []).source == "built in"
    f = tmp_path / "p.yaml"
    f.write_text("profiles:\n  local: {executor: local, env_vars: {A: '1'}}\n  mine: {extends: local}\n")
    assert resolve_profile("mine", [f]).settings == {"executor": "local", "env_vars": {"A": "1"}}
    assert resolve_profile("local", [f]).source == str(f)


@pytest.mark.parametrize(
    ("example", "name"),
    [
        ("local.yaml", "local_gpu"),
        ("local.yaml", "local_2proc"),
        ("slurm.yaml", "my_slurm"),
        ("slurm.yaml", "my_slurm_2nodes"),
        ("lepton.yaml", "my_lepton"),
        ("lepton.yaml", "my_lepton_2nodes"),
    ],
)
def test_the_example_profiles_compile(example, name, tmp_path, monkeypatch):
    """Each key in profiles/ is one its launcher knows (a typo there would be copied by every user)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(EXAMPLES / example))
    request = RunRequest(step="rs", config="default", batch_profile=name, dry_run=True)
    compiled = compile_request(load_catalog(), request)
    assert compiled.job.profile_name == name and compiled.plan.summary


BROKEN_PROFILES = {  # rlsteps.yaml's text -> the words of its one-line refusal
    "a profile that is a string": ("profiles:\n  p: slurm\n", "profile 'p' must be a mapping of settings, got 'slurm'"),
    "config that is a list": (
        "profiles:\n  p: {executor: local, config: [1, 2]}\n",
        "profile 'p': config must be a mapping of step config keys, got [1, 2]",
    ),
    "an interpolation to a missing key": (
        "profiles:\n  p: {executor: local, account: '${nowhere}'}\n",
        "profile 'p' cannot be resolved: Interpolation key 'nowhere' not found",
    ),
    "extends that is not a name": ("profiles:\n  p: {executor: local, extends: [q]}\n", "extends must be a profile"),
}


@pytest.mark.parametrize("case", list(BROKEN_PROFILES))
def test_a_broken_profile_is_refused_in_one_line_naming_the_file_and_the_profile(tmp_path, monkeypatch, case):
    text, words = BROKEN_PROFILES[case]
    (tmp_path / "rlsteps.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(UsageError) as refused:
        resolve_profile("p")
    assert str(refused.value).startswith(f"{tmp_path / 'rlsteps.yaml'}: ") and words in str(refused.value)
    assert "\n" not in str(refused.value)
