"""Container images: squash file names, enroot references, tag warnings, cache decisions, pyxis options.

Running a squash through a real srun with an enroot stand-in is in test_launch_slurm.py.
"""

from pathlib import Path

import pytest

from cli_helpers import invoke
from rlsteps.catalog import load_catalog
from rlsteps.launch import containers
from rlsteps.plan.runner import RunRequest, compile_request

IMAGE = "nvcr.io/nvidia/pytorch:25.10-py3"


def test_squash_file_name_is_the_sanitised_reference():
    assert containers.squash_file_name("nvcr.io/nvidia/nemo:25.11") == "nvcr_io_nvidia_nemo_25_11.sqsh"
    assert containers.squash_file_name("ubuntu") == "ubuntu.sqsh"


@pytest.mark.parametrize(
    "image, uri",
    [
        ("nvcr.io/nvidia/pytorch:25.10-py3", "docker://nvcr.io#nvidia/pytorch:25.10-py3"),
        ("localhost:5000/team/img:1", "docker://localhost:5000#team/img:1"),
        ("ubuntu:24.04", "docker://ubuntu:24.04"),
        ("library/ubuntu:24.04", "docker://library/ubuntu:24.04"),
    ],
)
def test_enroot_sets_a_registry_apart_with_a_hash(image, uri):
    assert containers.enroot_uri(image) == uri


@pytest.mark.parametrize(
    "image, warns",
    [
        ("nvcr.io/nvidia/pytorch:25.10-py3", False),
        ("nvcr.io/nvidia/pytorch:latest", True),
        ("nvcr.io/nvidia/pytorch", True),
        ("localhost:5000/img", True),  # the colon belongs to the registry's port: no tag
        ("nvcr.io/nvidia/pytorch@sha256:" + "a" * 64, False),
    ],
)
def test_a_latest_or_missing_tag_warns_that_the_cache_is_keyed_by_tag(image, warns):
    warning = containers.tag_warning(image)
    assert (warning is not None) == warns
    if warns:
        assert "--force-squash" in warning and image in warning


def test_cache_decisions_import_then_reuse_and_force_rebuilds(tmp_path):
    first = containers.plan_container(IMAGE, tmp_path, force=False)
    assert first.action == "import" and first.sqsh == tmp_path / "nvcr_io_nvidia_pytorch_25_10_py3.sqsh"
    first.sqsh.write_bytes(b"squashed")
    assert containers.plan_container(IMAGE, tmp_path, force=False).action == "reuse"
    assert containers.plan_container(IMAGE, tmp_path, force=True).action == "import"
    given = containers.plan_container(str(tmp_path / "mine.sqsh"), tmp_path / "cache", force=True)
    assert given.action == "given" and given.sqsh == tmp_path / "mine.sqsh"


def test_squash_script_imports_into_a_partial_file_then_renames_it(tmp_path):
    plan = containers.plan_container(IMAGE, tmp_path / "cache dir", force=False)
    script = containers.squash_script(plan, ["--partition=batch"], "20260101-000000-rl_rs")
    partial = f"'{tmp_path}/cache dir/nvcr_io_nvidia_pytorch_25_10_py3.sqsh.20260101-000000-rl_rs.partial'"
    assert (
        f"srun --nodes=1 --ntasks=1 --job-name=squash-20260101-000000-rl_rs --partition=batch enroot import "
        f"--output {partial} 'docker://nvcr.io#nvidia/pytorch:25.10-py3'"
    ) in script
    assert f"mv -f {partial} '{tmp_path}/cache dir/nvcr_io_nvidia_pytorch_25_10_py3.sqsh'" in script
    assert script.index("enroot import") < script.index("mv -f")


def test_pyxis_options_and_the_mount_check(tmp_path):
    plan = containers.plan_container(IMAGE, tmp_path, force=False)
    options = containers.pyxis_options(plan, ["/lustre:/lustre", "/data:/mnt/data:ro"], Path("/lustre/me"))
    assert options == [
        f"--container-image={plan.sqsh}",
        "--container-mounts=/lustre:/lustre,/data:/mnt/data:ro",
        "--container-workdir=/lustre/me",
    ]
    needed = [Path("/lustre/me/jobs/x"), Path("/data/x"), Path("/home/me")]
    assert containers.unmounted(needed, ["/lustre:/lustre", "/data:/mnt/data:ro"]) == [
        Path("/data/x"),
        Path("/home/me"),
    ]
    assert containers.unmounted([Path("/scratch/a")], ["/scratch"]) == []


@pytest.fixture
def container_profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text(
        "profiles:\n"
        "  gpu:\n"
        "    executor: slurm\n"
        "    partition: batch\n"
        f"    container_image: {IMAGE}\n"
        f"    container_mounts: ['{tmp_path}:{tmp_path}']\n"
        f"    squash_dir: {tmp_path}/squash\n"
        "  latest:\n"
        "    extends: gpu\n"
        "    container_image: nvcr.io/nvidia/pytorch:latest\n"
    )
    return tmp_path


def _plan(profile: str, force: bool = False):
    return compile_request(
        load_catalog(), RunRequest(step="rs", config="tiny", batch_profile=profile, force_squash=force)
    ).plan


def test_the_launch_plan_squashes_only_when_needed(container_profile):
    sqsh = container_profile / "squash" / "nvcr_io_nvidia_pytorch_25_10_py3.sqsh"
    first = _plan("gpu")
    assert containers.SQUASH_SCRIPT in first.files and "squashed first into" in first.summary
    assert f"--container-image={sqsh}" in first.files["sbatch.sh"]
    sqsh.parent.mkdir()
    sqsh.write_bytes(b"squashed")
    again = _plan("gpu")
    assert containers.SQUASH_SCRIPT not in again.files and f"reusing {sqsh}" in again.summary
    assert containers.SQUASH_SCRIPT in _plan("gpu", force=True).files
    assert "warning: image nvcr.io/nvidia/pytorch:latest has the tag :latest" in _plan("latest").summary


def test_dry_run_shows_the_squash_commands_and_writes_nothing(container_profile):
    result = invoke("run", "rs", "-c", "tiny", "-b", "gpu", "--dry-run", "--force-squash")
    assert result.exit_code == 0, result.output
    assert "squash.sh" in result.stdout and "enroot import --output" in result.stdout
    assert "docker://nvcr.io#nvidia/pytorch:25.10-py3" in result.stdout
    assert "--container-image=" in result.stdout
    assert not (container_profile / ".rlsteps").exists() and not (container_profile / "squash").exists()
