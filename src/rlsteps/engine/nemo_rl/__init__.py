"""engine=nemo_rl: rl/rlhf and rl/reinforce on NeMo-RL's GRPO loop, inside NeMo-RL's container.

master_config: the step's config compiled to NeMo-RL's GRPO master config, key by key (pure; the dry run prints it).
layout: where the job keeps NeMo-RL's inputs, checkpoints, logs and Ray's state under the run directory.
data: prompt_jsonl rows written as the rows NeMo-RL's datasets read.
stages: what the job runs around NeMo-RL's driver: `prepare` (inputs into the forms NeMo-RL loads) and `finish`
  (NeMo-RL's last checkpoint back as the step's typed output artifact).
ray_nodes: the head's wait for every node's Ray.

The version followed is NeMo-RL v0.7.0 (tag commit 81aa43d) with the NeMo-Gym commit it pins (d67ad66): its examples/configs/grpo_math_1B.yaml and its
config types; the rl/rlhf judge keys follow NeMo-Gym's genrm_compare server as Nemotron's rl/nemo_rl/rlhf step
sets it.
"""

NEMO_RL_VERSION = "v0.7.0 (81aa43d), NeMo-Gym d67ad66"
NEMO_RL_CONTAINER = "nvcr.io/nvidia/nemo-rl:v0.7.0"
