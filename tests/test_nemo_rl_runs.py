"""Every config rlsteps compiles for NeMo-RL runs NeMo-RL v0.7.0's own code: its driver's config handling,
grpo.setup (cluster and placement arithmetic, the dtype and other checks, tokenizer and data over real prompt rows)
and a GRPO step's data path (batching, advantages, shard_by_batch_size, the loss function's inputs, the checkpoint
manager, the logger), with only the GPU work stood in (tests/nemo_rl_run.py). What NeMo-RL would stop on is
refused when the job compiles, with NeMo-RL's arithmetic and a fix; the fix, applied, runs. One case runs on a real
Ray cluster (NeMo-RL's actors its processes; the others on the in-process Ray, tests/nemo_rl_run.py says why), and
every case with a judge shows where NeMo-Gym's own code places it: on GPUs none of NeMo-RL's cluster holds."""

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

import upstream
from rlsteps.catalog import load_catalog
from rlsteps.contract.algorithms import nemo_rl_form
from rlsteps.contract.nemo_rl_job import MASTER_CONFIG_FILE
from rlsteps.engine.nemo_rl_stages.data import write_rows
from rlsteps.engine.rewards.combined import RewardTerm
from rlsteps.errors import UsageError
from rlsteps.plan.runner import RunRequest, compile_request

pytestmark = pytest.mark.slow  # NeMo-RL's own code, in a process of its own

REPO = Path(__file__).resolve().parent.parent
SEED = "rl/nemo_rl/rlhf"
JUDGE = "env.nemo_gym.genrm_model.responses_api_models.vllm_model"
SEED_INPUTS = ("data.train.data_path=/lustre/p.jsonl", "data.validation.data_path=/lustre/v.jsonl",
               "policy.model_name=/lustre/sft")  # fmt: skip
RLHF_INPUTS = ("engine=nemo_rl", "inputs.prompts=/lustre/p.jsonl", "inputs.val_prompts=/lustre/v.jsonl",
               "inputs.policy=/lustre/sft", "inputs.judge_model=/lustre/judge", "output.dir=/lustre/run")  # fmt: skip
REINFORCE_INPUTS = ("engine=nemo_rl", "inputs.prompts=/lustre/p.jsonl", "inputs.policy=/lustre/sft",
                    "inputs.reward_model=/lustre/rm", "output.dir=/lustre/run")  # fmt: skip
LEPTON_REINFORCE_INPUTS = tuple(item.replace("/lustre/", "/data/") for item in REINFORCE_INPUTS)
# the same run with the reward model's rewards clipped and scaled: NeMo-RL's grpo.reward_scaling as rlsteps maps it
UNSCALED, SCALED = "rl/reinforce on the Lepton example profile", "rl/reinforce, rewards clipped and scaled"
CLIP, SCALE = (-0.01, 0.05), 20.0  # the stand-in reward model scores every row of this run about -0.02
GPU_PROFILES = {
    "one_node": {
        "executor": "slurm",
        "nodes": 1,
        "gpus_per_node": 8,
        "container_image": "/images/nemo-rl.sqsh",
        "job_dir": "/lustre/jobs",
        "cluster_paths": ["/lustre"],
    },  # fmt: skip
    "two_nodes": {"extends": "one_node", "nodes": 2},
    "a_node_of_two": {"extends": "one_node", "gpus_per_node": 2},
    "four_nodes": {"extends": "one_node", "nodes": 4},
}
CASES = {  # name: (step, config, batch profile, overrides): what users compile, each run by NeMo-RL's own code
    "seed page, Slurm": (SEED, "default", "slurm_rl_nemo_rl_rlhf", ("grpo.max_num_steps=1000",
                          "data.train.data_path=/lustre/rlhf/train.jsonl",
                          "data.validation.data_path=/lustre/rlhf/val.jsonl", "policy.model_name=/lustre/sft")),
    "seed page, Lepton, 16 generations": (SEED, "default", "lepton_rl_nemo_rl_rlhf", (
        f"{JUDGE}.model=nvidia/Nemotron-Reward-Model", "grpo.num_generations_per_prompt=16",
        "output.dir=/data/runs/rlhf", "data.train.data_path=/data/p.jsonl", "policy.model_name=/data/sft")),
    "4 generations": (SEED, "default", "two_nodes", (*SEED_INPUTS, "grpo.num_generations_per_prompt=4")),
    "tensor parallel 2": (SEED, "default", "two_nodes", (*SEED_INPUTS, "policy.dtensor_cfg.tensor_parallel_size=2")),
    "megatron, tensor parallel 2": (SEED, "default", "two_nodes", (*SEED_INPUTS, "policy.megatron_cfg.enabled=true",
                                    "policy.dtensor_cfg.enabled=false",
                                    "policy.megatron_cfg.tensor_model_parallel_size=2")),
    "a judge at a local path": (SEED, "default", "two_nodes", (*SEED_INPUTS, f"{JUDGE}.model=/lustre/judge")),
    "one node": (SEED, "default", "one_node", SEED_INPUTS),
    "four nodes": (SEED, "default", "four_nodes", SEED_INPUTS),
    "tiny on two nodes": (SEED, "tiny", "two_nodes", ("output.dir=/lustre/run",)),
    "tiny, megatron": (SEED, "tiny", "two_nodes", ("output.dir=/lustre/run", "policy.megatron_cfg.enabled=true",
                       "policy.dtensor_cfg.enabled=false")),
    "rl/rlhf on one node": ("rl/rlhf", "default", "one_node", RLHF_INPUTS),
    "rl/rlhf on the Slurm example profile": ("rl/rlhf", "default", "my_slurm_nemo_rl", RLHF_INPUTS),
    "rl/rlhf on four nodes": ("rl/rlhf", "default", "four_nodes", RLHF_INPUTS),
    "rl/rlhf, megatron": ("rl/rlhf", "default", "two_nodes", (*RLHF_INPUTS, "nemo_rl_job.policy_backend=megatron")),
    "rl/rlhf, no warmup": ("rl/rlhf", "default", "two_nodes", (*RLHF_INPUTS, "train.warmup_steps=0")),
    "rl/reinforce on one node": ("rl/reinforce", "default", "one_node", REINFORCE_INPUTS),
    UNSCALED: ("rl/reinforce", "default", "my_lepton_nemo_rl", LEPTON_REINFORCE_INPUTS),
    "rl/reinforce on four nodes": ("rl/reinforce", "default", "four_nodes", REINFORCE_INPUTS),
    SCALED: ("rl/reinforce", "default", "my_lepton_nemo_rl", (*LEPTON_REINFORCE_INPUTS,
             f"rewards.reward_model.clip=[{CLIP[0]},{CLIP[1]}]", f"rewards.reward_model.scale={SCALE}")),
    "rl/rlhf, LoRA on two modules": ("rl/rlhf", "default", "two_nodes", (*RLHF_INPUTS, "train.lora.enabled=true",
                                     "train.lora.dim=16", "train.lora.target_modules=[q_proj,v_proj]")),
    "rl/reinforce, LoRA": ("rl/reinforce", "default", "two_nodes", (*REINFORCE_INPUTS, "train.lora.enabled=true",
                           "train.lora.lr=3e-4")),  # the adapters' own rate: NeMo-RL's one optimizer rate
    "seed page, LoRA": (SEED, "default", "two_nodes", (*SEED_INPUTS, "policy.dtensor_cfg.lora_cfg.enabled=true")),
    "rl/reinforce, dynamic batching": ("rl/reinforce", "default", "two_nodes", (*REINFORCE_INPUTS,
                                       "train.dynamic_batching=true")),
    "rl/rlhf, megatron, dynamic batching": ("rl/rlhf", "default", "two_nodes", (*RLHF_INPUTS,
                                            "nemo_rl_job.policy_backend=megatron", "train.dynamic_batching=true")),
    "seed page, context parallel 2": (SEED, "default", "two_nodes", (*SEED_INPUTS,
                                      "policy.dtensor_cfg.context_parallel_size=2")),
    "seed page, megatron, context parallel 2, dynamic batching": (SEED, "default", "two_nodes", (*SEED_INPUTS,
        "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false",
        "policy.megatron_cfg.context_parallel_size=2", "policy.dynamic_batching.enabled=true",
        "policy.sequence_packing.enabled=false")),
    "rl/rlhf on a node of 2 GPUs, real Ray": ("rl/rlhf", "default", "a_node_of_two", RLHF_INPUTS),
}  # fmt: skip
# run on a real Ray cluster, where NeMo-RL's actors are processes of their own (tests/nemo_rl_run.py says why the others
# run on the in-process Ray; the real-Ray case, about a minute, runs beside them). One: each more costs CI about 50 s,
# and rl/reinforce's driver takes two steps on the in-process Ray ("rl/reinforce on one node")
REAL_RAY = {"rl/rlhf on a node of 2 GPUs, real Ray"}
# past the first step, one case a driver and policy backend: a second rollout after a refit, and (where the case has
# validation prompts) a validation at step 2
TWO_STEPS = {
    "tiny on two nodes": True,
    "rl/rlhf, megatron": True,
    "rl/reinforce on one node": False,
    "rl/rlhf on a node of 2 GPUs, real Ray": True,
}
ORACLE_DRIVER = {"examples/nemo_gym/run_grpo_nemo_gym.py": "nemo_gym", "examples/run_grpo.py": "grpo"}


def compile_case(step: str, config: str, profile: str, overrides: tuple[str, ...]):
    request = RunRequest(step, config, batch_profile=profile, dry_run=True, overrides=overrides)
    return compile_request(load_catalog(), request)


def runnable(compiled, tiny_world, folder: Path, steps: int = 1, ray: str = "in-process") -> dict:
    """The compiled job's master config, moved under `folder` with the files the job's prepare stage would write
    there (the tiny world's policy and prompts, as NeMo-RL's rows) and the reward model at the tiny world's."""
    text = compiled.plan.files[MASTER_CONFIG_FILE]
    master = yaml.safe_load(text)
    run_dir = master["policy"]["model_name"].removesuffix("/nemo_rl/policy_hf")
    text = text.replace(run_dir + "/", f"{folder}/")
    for reward_model in ("/lustre/rm", "/data/rm"):
        text = text.replace(reward_model, str(tiny_world.reward_model))
    master = yaml.safe_load(text)
    root = folder / "nemo_rl"
    (root / "data").mkdir(parents=True)
    (root / "policy_hf").symlink_to(tiny_world.policy, target_is_directory=True)
    agent = compiled.job.config.get("nemo_rl_job", {}).get("gym_agent", "genrm_simple_agent")
    write_rows(str(tiny_world.train_prompts), root / "data" / "train.jsonl", compiled.job.algorithm, agent)
    if master["data"].get("validation"):
        write_rows(str(tiny_world.val_prompts), root / "data" / "validation.jsonl", compiled.job.algorithm, agent)
    path = folder / "master.yaml"
    path.write_text(yaml.safe_dump(master))
    settings = compiled.job.launcher_settings
    return {
        "config": str(path),
        "driver": ORACLE_DRIVER[nemo_rl_form(compiled.job.algorithm).driver],
        "nodes": settings["nodes"],
        "gpus_per_node": settings["gpus_per_node"],
        "steps": steps,
        "ray": ray,
    }


def project_with_profiles(folder: Path, profiles: dict) -> Iterator[Path]:
    """`folder` as the working directory, its rlsteps.yaml holding the shipped example profiles and `profiles`."""
    shipped = {}
    for name in ("slurm.yaml", "lepton.yaml"):
        shipped.update(yaml.safe_load((REPO / "profiles" / name).read_text())["profiles"])
    (folder / "rlsteps.yaml").write_text(yaml.safe_dump({"profiles": {**shipped, **profiles}}))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        yield folder


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    yield from project_with_profiles(tmp_path_factory.mktemp("nemo_rl_runs"), GPU_PROFILES)


@pytest.fixture(scope="module")
def outcomes(project, tiny_world):
    """Each case compiled; a refused one compiled again with its fix; every compiled one run by NeMo-RL's code."""
    refused, runs = {}, []
    for name, (step, config, profile, overrides) in CASES.items():
        try:
            compiled = compile_case(step, config, profile, overrides)
        except UsageError as error:
            refused[name] = error
            fixed = (*overrides, *error.fix.split())
            runs.append((f"{name}, fixed", compile_case(step, config, profile, fixed)))
        else:
            runs.append((name, compiled))
    cases = [{"name": name, **runnable(c, tiny_world, project / f"run{n}", *how_to_run(name))}
             for n, (name, c) in enumerate(runs)]  # fmt: skip
    cases.append(control(cases[0], project / "control", CONTROL, _batch_of_512))
    by_name = {case["name"]: case for case in cases}
    lora = by_name["rl/reinforce, LoRA"]
    cases.append(control(lora, project / "control_v1", LORA_ON_V1, _on_the_v1_worker))
    cases.append(control(lora, project / "control_key", LORA_KEY, _a_key_nemo_rl_lacks))
    dtensor_cp, megatron_cp = (by_name.get(f"{name}, fixed") or by_name[name] for name in CONTEXT_PARALLEL)
    cases.append(control(dtensor_cp, project / "control_cp", CP_PACKED, _packed))
    cases.append(control(megatron_cp, project / "control_mcore_cp", CP_UNPACKED, _batched_dynamically))
    cases.append(control(by_name[JUDGED], project / "control_judge", JUDGE_CROWDED, _the_policy_on_every_gpu))
    results = upstream.run_nemo_rl(cases, project)
    yield refused, results
    for n in range(len(runs)):
        shutil.rmtree(project / f"run{n}", ignore_errors=True)


def how_to_run(name: str) -> tuple[int, str]:
    """A case's steps and its Ray."""
    case = name.removesuffix(", fixed")
    return 2 if case in TWO_STEPS else 1, "real" if case in REAL_RAY else "in-process"


CONTROL = "control: 256 rows a step, a global batch of 512"
LORA_ON_V1 = "control: LoRA on the DTensor v1 worker"
LORA_KEY = "control: a lora_cfg key NeMo-RL does not declare"


CONTEXT_PARALLEL = ("seed page, context parallel 2", "seed page, megatron, context parallel 2, dynamic batching")
CP_PACKED = "control: context parallel 2 on DTensor, packed"
CP_UNPACKED = "control: context parallel 2 on Megatron, batched dynamically"


JUDGED = "rl/rlhf on a node of 2 GPUs, real Ray"
JUDGE_CROWDED = "control: the policy on every GPU of the judge's node"


def _the_policy_on_every_gpu(master: dict) -> None:
    master["cluster"]["gpus_per_node"] += 1  # the judge's GPU, which rlsteps leaves out of NeMo-RL's cluster


def _packed(master: dict) -> None:
    master["policy"]["sequence_packing"]["enabled"] = True


def _batched_dynamically(master: dict) -> None:
    master["policy"]["sequence_packing"]["enabled"] = False
    master["policy"]["dynamic_batching"]["enabled"] = True


def _batch_of_512(master: dict) -> None:
    """The seed command's config as rlsteps compiled it before the global batch followed the rows."""
    master["policy"]["train_global_batch_size"] = 512


def _on_the_v1_worker(master: dict) -> None:
    master["policy"]["dtensor_cfg"]["_v2"] = False


def _a_key_nemo_rl_lacks(master: dict) -> None:
    master["policy"]["dtensor_cfg"]["lora_cfg"]["rank"] = 8


def control(case: dict, folder: Path, name: str, change) -> dict:
    """A compiled case's config with a change rlsteps would not make, to run beside the cases."""
    master = yaml.safe_load(Path(case["config"]).read_text())
    change(master)
    folder.mkdir()
    (folder / "master.yaml").write_text(yaml.safe_dump(master).replace(str(Path(case["config"]).parent), str(folder)))
    shutil.copytree(Path(case["config"]).parent / "nemo_rl", folder / "nemo_rl", symlinks=True)
    return {**case, "name": name, "config": str(folder / "master.yaml"), "ray": "in-process"}


def test_the_run_check_fails_where_nemo_rl_fails(outcomes):
    """What the schema accepted and NeMo-RL's first step stopped on, caught where NeMo-RL catches it."""
    result = outcomes[1][CONTROL]
    assert not result["ok"]
    assert result["error"] == "AssertionError: Total batch size (256) is not a multiple of batch_size (512)"
    assert result["where"].startswith("nemo_rl/distributed/batched_data_dict.py:")
    assert "lm_policy.py" in result["traceback"] and "in grpo_train" in result["traceback"]


def test_nemo_rl_itself_stops_lora_on_its_v1_worker_and_a_lora_cfg_key_it_does_not_declare(outcomes):
    """What rlsteps never compiles (the v1 worker with LoRA: refused at compile time) is NeMo-RL's own check, and
    the stand-in worker holds the compiled lora_cfg to NeMo-RL's declaration of it."""
    results = outcomes[1]
    on_v1 = results[LORA_ON_V1]
    assert not on_v1["ok"] and on_v1["error"] == "AssertionError: LoRA is not supported for DTensorPolicyWorker V1"
    assert on_v1["where"].startswith("nemo_rl/models/policy/lm_policy.py:")
    assert not results[LORA_KEY]["ok"] and "not in NeMo-RL's LoRAConfig ['rank']" in results[LORA_KEY]["error"]


def test_nemo_rl_itself_stops_what_rlsteps_refuses_of_context_parallelism(outcomes):
    """The refused context-parallel configs, run as they were asked: NeMo-RL's own worker setup stops on each."""
    results = outcomes[1]
    packed, unpacked = results[CP_PACKED], results[CP_UNPACKED]
    assert not packed["ok"] and packed["error"].startswith("ValueError: Context parallel is not supported for sequence")
    assert packed["where"].startswith("nemo_rl/models/automodel/setup.py:")
    assert not unpacked["ok"]
    assert (
        unpacked["error"] == "AssertionError: Sequence Packing must be enabled to use Context Parallelism with MCore."
    )
    assert unpacked["where"].startswith("nemo_rl/models/megatron/setup.py:")


def describe(result: dict) -> str:
    return f"{result.get('error')} at {result.get('where')}\n{result.get('traceback', '')[-3000:]}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_nemo_rl_runs_a_step_of_what_rlsteps_compiles_or_rlsteps_refuses_it_with_a_fix_that_runs(outcomes, case):
    refused, results = outcomes
    name = f"{case}, fixed" if case in refused else case
    result = results[name]
    assert result["ok"], describe(result)
    assert result["steps"] == (2 if case in TWO_STEPS else 1) and Path(result["checkpoint"]).is_dir()
    if TWO_STEPS.get(case):
        assert "Starting validation at step 2" in result["log"], result["log"][-3000:]
    if case in REAL_RAY:  # the policy's workers were processes of real Ray's
        assert result["driver_pid"] not in result["actors"]["DTensorPolicyWorkerV2"], result["actors"]
    if case in refused:
        error = refused[case]
        assert EXPECTED_REFUSALS[case] in error.message, error.message
        assert "=" in error.fix


# The cases above that rlsteps refuses, and what it says of them: the arithmetic and the checks are NeMo-RL's own
# (the controls run what was refused, and NeMo-RL stops on it).
PLACEMENT = "NeMo-RL would stop at its first step"
EXPECTED_REFUSALS = {
    **dict.fromkeys(("one node", "four nodes", "rl/rlhf on one node", "rl/rlhf on four nodes",
                     "rl/reinforce on one node", "rl/reinforce on four nodes"), PLACEMENT),
    CONTEXT_PARALLEL[0]: "'Context parallel is not supported for sequence packing'",
    CONTEXT_PARALLEL[1]: "'Sequence Packing must be enabled to use Context Parallelism with MCore'",
}  # fmt: skip


def test_only_what_nemo_rl_cannot_run_is_refused(outcomes):
    refused, _ = outcomes
    assert set(refused) == set(EXPECTED_REFUSALS), {name: str(error) for name, error in refused.items()}
    assert all("data-parallel rank(s)" in refused[name].message for name, said in EXPECTED_REFUSALS.items()
               if said == PLACEMENT)  # fmt: skip
    assert refused[CONTEXT_PARALLEL[0]].fix == "policy.sequence_packing.enabled=false"
    assert (
        refused[CONTEXT_PARALLEL[1]].fix == "policy.sequence_packing.enabled=true policy.dynamic_batching.enabled=false"
    )
    assert refused["one node"].fix == "grpo.num_prompts_per_step=35 policy.train_global_batch_size=280"
    assert refused["rl/rlhf on one node"].fix.startswith("rollout.prompts_per_step=")


def logged_rewards(result: dict, project: Path) -> list[float]:
    """The rewards NeMo-RL trained its first step on, from its own log of the step (train_data_step1.jsonl)."""
    run = next(folder for folder in Path(result["checkpoint"]).parents if folder.parent == project)
    (log,) = run.rglob("train_data_step1.jsonl")
    return [json.loads(line)["rewards"] for line in log.read_text().splitlines()]


def test_nemo_rl_clips_and_scales_the_rewards_as_the_embedded_engine_does(outcomes, project):
    """rewards.<name>.clip and scale on engine=nemo_rl: NeMo-RL's own scale_rewards gives, from the rewards of the
    same run without them, what rlsteps' own reward term gives."""
    _, results = outcomes
    raw, scaled = (torch.tensor(logged_rewards(results[name], project)) for name in (UNSCALED, SCALED))
    assert (raw < CLIP[0]).any() or (raw > CLIP[1]).any(), raw  # the clip moves them
    expected = RewardTerm("reward_model", 1.0, source=None, clip=CLIP, scale=SCALE).shape(raw)
    torch.testing.assert_close(scaled, expected)


JUDGE_GROUP = "genrm_model_dp_rank_0"  # NeMo-Gym names a vLLM server's placement groups <server>_dp_rank_<n>


def gpus_of(group: dict) -> float:
    return sum(bundle.get("GPU", 0) for bundle in group["bundles"])


def test_nemo_gym_reserves_the_judge_gpus_of_its_own_beside_the_policy_on_real_ray(outcomes):
    """rl/rlhf on one node: rlsteps gives NeMo-RL's cluster the GPUs the judge does not take, and NeMo-Gym's own
    placement of its judge (LocalVLLMModel's head-node group, in NeMo-RL's NemoGym actor, a process of real Ray's)
    gets the rest: both hold their GPUs on the one node at once, so neither shares one."""
    result = outcomes[1][JUDGED]
    assert result["ok"], describe(result)
    actors = result["actors"]  # NeMo-RL's actors, each a process of real Ray's
    pids = [pid for name in ("DTensorPolicyWorkerV2", "VllmAsyncGenerationWorker", "NemoGym") for pid in actors[name]]
    assert len(set(pids)) == 3 and result["driver_pid"] not in pids, actors
    groups = {group["name"]: group for group in result["placements"]}
    judge = groups.pop(JUDGE_GROUP)
    assert judge["strategy"] == "STRICT_PACK" and judge["state"] == "CREATED", judge
    assert judge["bundles"] == [{"GPU": 1.0}, {"CPU": 1.0}]  # tensor x pipeline parallel GPUs, and the server's CPU
    assert gpus_of(judge) + sum(gpus_of(group) for group in groups.values()) == 2  # the node's, each held once
    assert {node for group in result["placements"] for node in group["nodes"]} == {judge["nodes"][0]}
    assert "Starting validation at step 2" in result["log"]


def test_the_judge_never_gets_a_gpu_of_the_policy_or_generation(outcomes):
    """Every case with a judge on the in-process Ray, one node or several: the GPUs of Gym's judge group are none of
    those NeMo-RL's cluster holds (node and GPU id); with the judge's GPU given to NeMo-RL's cluster too, Gym's own
    placement of the judge cannot be held, and the run stops there."""
    judged = {name: result for name, result in outcomes[1].items() if result.get("ok") and
              any(group["name"] == JUDGE_GROUP for group in result["placements"]) and "gpu_ids" in
              result["placements"][0]}  # fmt: skip
    assert len(judged) >= 10, sorted(judged)
    for name, result in judged.items():
        held = {(group["name"] == JUDGE_GROUP, node, gpu) for group in result["placements"]
                for node, ids in zip(group["nodes"], group["gpu_ids"]) for gpu in ids}  # fmt: skip
        judge = {(node, gpu) for is_judge, node, gpu in held if is_judge}
        assert judge and not judge & {(node, gpu) for is_judge, node, gpu in held if not is_judge}, name
    crowded = outcomes[1][JUDGE_CROWDED]
    no_room = "Unschedulable: no node can hold all 2 bundles [{'GPU': 1.0}, {'CPU': 1.0}] (STRICT_PACK)"
    assert not crowded["ok"] and crowded["error"].endswith(no_room), describe(crowded)
    assert "in _select_vllm_server_head_node" in crowded["traceback"], crowded["traceback"]
