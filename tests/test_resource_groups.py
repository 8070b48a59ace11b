"""README's test command shares the tests out by the resource they use: the Slurm tests one after another, the
vLLM files one after another, every other file whole, the longest groups first."""

from pathlib import Path

from resource_groups import LONGEST_FIRST, group_of, rank

ROOT = Path(__file__).resolve().parent.parent


def test_a_test_that_uses_the_cluster_is_in_the_slurm_group_and_its_neighbours_stay_with_their_file():
    cluster = "tests/test_launch_slurm.py::test_a_batch_job_trains_on_slurm_and_jobs_reports_it"
    dry = "tests/test_launch_slurm.py::test_hostile_names_and_values_stay_single_words"
    parametrized = "tests/test_run_lifecycle.py::test_a_signal_to_rlsteps_streaming_a_slurm_job_cancels_the_job[SIGHUP]"
    assert group_of(cluster, ROOT) == "slurm" and group_of(parametrized, ROOT) == "slurm"
    assert group_of(dry, ROOT) == "test_launch_slurm"


def test_a_file_that_starts_vllm_is_in_the_vllm_group_and_others_are_their_own():
    assert group_of("tests/test_judge_vllm.py::test_anything", ROOT) == "vllm"
    assert group_of("tests/test_cli.py::test_anything[x]", ROOT) == "test_cli"


def test_the_longest_groups_come_first_and_the_rest_after_them_in_their_order():
    assert [rank(g) for g in ("slurm", "vllm", "test_verifiable_learning", "test_runs")] == [0, 1, 2, 3]
    assert rank("test_cli") == rank("test_docs") == len(LONGEST_FIRST)
    assert all((ROOT / "tests" / f"{g}.py").is_file() for g in LONGEST_FIRST if g not in ("vllm", "slurm"))
