"""The seed page's Command Examples for rl/nemo_rl/rlhf, as rlsteps words (dry runs where they would submit): the
profiles they name are the shipped example profiles."""

STEP = "rl/nemo_rl/rlhf"
JUDGE = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"
SEED_COMMANDS = [
    ["steps", "run", STEP, "-c", "default", "--dry-run"],
    ["steps", "run", STEP, "-c", "default", "-r", "lepton_rl_nemo_rl_rlhf", f"{JUDGE}=nvidia/Nemotron-Reward-Model",
     "grpo.num_generations_per_prompt=16", "--dry-run"],
    ["steps", "run", STEP, "-c", "default", "-b", "slurm_rl_nemo_rl_rlhf", "grpo.max_num_steps=1000",
     "data.train.data_path=/lustre/rlhf/train.jsonl", "data.validation.data_path=/lustre/rlhf/val.jsonl", "--dry-run"],
    ["run", STEP, "-c", "tiny", "--dry-run"],
]  # fmt: skip
