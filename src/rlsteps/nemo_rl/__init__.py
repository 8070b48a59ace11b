"""A step compiled for NeMo-RL: rl/nemo_rl/rlhf, and rl/rlhf and rl/reinforce with engine=nemo_rl (pure, torch-free;
the dry run prints its result). A peer of plan/: it compiles for another engine, as plan/ does for the embedded one.

  master_config: a step's config to NeMo-RL's master config; templates: the shipped complete master config
  (steps/rl/nemo_rl/*.yaml); key_map: the keys rlsteps's recipes share with NeMo-RL; environments: the judge and the
  reward model (env.*); placement: the profile's GPUs split between policy, judge and reward model; batches: the
  rows a step makes and how NeMo-RL's policy splits them; schedule: the learning-rate schedule as NeMo-RL's workers
  build it; semantics: where the two engines differ; lora: train.lora as NeMo-RL's lora_cfg; schema: NeMo-RL's
  master-config keys (master_config_schema.json), for overrides; embedded: rl/nemo_rl/rlhf mapped onto rl/rlhf's
  recipe where no NeMo-RL runs; layout: where the job keeps its files; policy_checks: what NeMo-RL's Policy and its
  asynchronous loop assert; model_shapes: the policy's heads, layers and experts against its parallel sizes;
  vllm_args (over vllm_fields): the keywords handed to vLLM against vLLM's own argument names; judge_context: the
  judge's max_model_len against the longest request it is sent; memory (over memory_terms): the memory each GPU
  holds, estimated from the policy's config.json, against the profile's gpu_memory_gib.

What the job runs around NeMo-RL's driver (its stages) is the engine's: rlsteps.engine.nemo_rl_stages.

The version followed is NeMo-RL v0.7.0 (tag commit 81aa43d) and the NeMo-Gym commit it pins (d67ad66); the tests
judge what the compile writes with their own code.
"""

NEMO_RL_VERSION = "v0.7.0 (81aa43d), NeMo-Gym d67ad66"
NEMO_RL_CONTAINER = "nvcr.io/nvidia/nemo-rl:v0.7.0"
