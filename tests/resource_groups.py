"""How README's test command (`pytest -n 2 --dist loadgroup`) shares the tests out between its two workers.

Tests that share a machine-wide resource run one after another on one worker: those that use the two-node Slurm
cluster (the `slurm_cluster` fixture: a second job would queue behind the first and miss its deadlines) and the files
that start vLLM (each engine takes gigabytes and every core it finds). Every other file runs whole on one worker, so
its module fixtures are built once.

A test's group follows from its id alone (its file's text and its function's signature and decorators), so the
controller, which never collects, and the workers, which do, agree on it. xdist's own `xdist_group` marks cannot
do this under pytest 9: xdist 3.8 writes the group into `item._nodeid`, which pytest 9 no longer reads, so every
test became a group of its own, the Slurm tests ran beside each other and the vLLM engines two at a time.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

# a vLLM started, not only its model folder read
VLLM_SIGNS = ("vllm_python(", "vllm_judge(", "vllm_reward_server(", ".venv-vllm")
CLUSTER_SIGNS = ("needs_cluster", "slurm_cluster")  # a decorator `@needs_cluster` or a `slurm_cluster` argument

# The groups that take longest, longest first (measured in CI). Each worker takes the next group when it is nearly
# done, so the short files fill the end instead of one long group holding the run up. The Slurm group, which mostly
# waits for the cluster, and the vLLM group, whose engines take the cores the waiting leaves, start the two workers;
# the pretrained model's learning test (one core for about 9 minutes) follows, beside groups that keep a core busy:
# started beside the Slurm group, it left a quarter to a half of the CPU idle for 9 minutes (vmstat, in CI).
LONGEST_FIRST = (
    "slurm",
    "vllm",
    "test_verifiable_learning",
    "test_runs",
    "test_nemo_rl_runs",
    "test_records_on_resume",
    "test_pipeline_runs",
    "test_lora_runs",
    "test_family_runs",
    "test_tiny",
    "test_megatron_bridge",
    "test_distributed_runs",
    "test_run_faults",
    "test_disk_full",
    "test_nemo_rl_oracle",
    "test_ray_job",
)


@functools.cache
def _file_facts(path: Path) -> tuple[bool, frozenset[str]]:
    """Whether the file starts vLLM, and the names of its tests that use the Slurm cluster."""
    text = path.read_text()
    cluster_tests = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            names = [ast.unparse(d) for d in node.decorator_list] + [a.arg for a in node.args.args]
            if any(sign in name for name in names for sign in CLUSTER_SIGNS):
                cluster_tests.add(node.name)
    return any(sign in text for sign in VLLM_SIGNS), frozenset(cluster_tests)


def group_of(nodeid: str, rootdir: Path) -> str:
    """'slurm', 'vllm' or the test file's stem, for an id such as tests/test_x.py::test_y[param]."""
    file, _, rest = nodeid.partition("::")
    starts_vllm, cluster_tests = _file_facts(rootdir / file)
    if rest.split("::")[-1].split("[")[0] in cluster_tests:
        return "slurm"
    return "vllm" if starts_vllm else Path(file).stem


def rank(group: str) -> int:
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


def grouped_by_resource(config) -> bool:
    """README's test command: the controller sees `--dist loadgroup`; its workers, which collect the tests and so
    order them, see `dist` as "no" and xdist's own `loadgroup` flag set."""
    return config.getoption("dist", "no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


def make_scheduler(config, log):
    """xdist's scope scheduler with group_of as the scope, the groups in the workers' (sorted) order."""
    from xdist.scheduler import LoadScopeScheduling

    class ResourceGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid, config.rootpath)

    config.option.loadscopereorder = False  # xdist would order the groups by their number of tests instead
    return ResourceGroupScheduling(config, log)
