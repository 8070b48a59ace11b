"""NeMo-RL's GRPO loop, inside NeMo-RL's container: rl/nemo_rl/rlhf, and rl/rlhf and rl/reinforce with engine=nemo_rl.

The compile (pure, torch-free; the dry run prints its result):
  master_config: a step's config to NeMo-RL's master config; templates: the shipped complete master config
  (steps/rl/nemo_rl/*.yaml); key_map: the keys rlsteps's recipes share with NeMo-RL; environments: the judge and the
  reward model (env.*); placement: the profile's GPUs split between policy, judge and reward model; schedule: the
  learning-rate schedule as NeMo-RL's workers build it; semantics: where the two engines differ; schema: NeMo-RL's
  master-config keys (master_config_schema.json), for overrides; embedded: rl/nemo_rl/rlhf mapped onto rl/rlhf's
  recipe where no NeMo-RL runs.
The job: layout (its files under the run directory), data (prompt rows as NeMo-RL's datasets read them), stages
(`prepare` and `finish` around NeMo-RL's driver), ray_nodes (the head's wait for every node's Ray).

The version followed is NeMo-RL v0.7.0 (tag commit 81aa43d) and the NeMo-Gym commit it pins (d67ad66); the tests
judge what the compile writes with their own code.
"""

NEMO_RL_VERSION = "v0.7.0 (81aa43d), NeMo-Gym d67ad66"
NEMO_RL_CONTAINER = "nvcr.io/nvidia/nemo-rl:v0.7.0"
