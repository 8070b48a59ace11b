"""The tiny world's recipe: sizes, steps and learning rates.

Changing any of it changes the world: bump TINY_WORLD_VERSION (rlsteps.tiny.layout), part of the cache key.
"""

BUILD_THREADS = 1  # fixed, so the weights do not depend on the machine; also the fastest on a shared CPU
TOKENIZER_VOCAB = 640  # an upper bound: the merges run out near 580, with every task word one token
# heads of 32: the smallest vLLM's CPU attention serves. One wide layer, not two of 64: RL moves the policy to answers
# the SFT data holds few of (four positive adjectives), and the two-layer 64-wide policy's sampled answers then broke
# off mid-list into another sentence ("The flower seems bright, kind cloud seems charming.") twice to three times as
# often as at the start; this one's stay as rare as its SFT answers' (benchmarks/tiny_learning.py). It is no slower.
POLICY_SIZE = {"hidden": 128, "layers": 1, "heads": 4}
# the reward model is grown from an SFT model of its own, two layers of 64: one layer does not learn to count the
# positive adjectives or to see a word said twice (one more positive scored higher in 34-70% of probes)
REWARD_BACKBONE_SIZE = {"hidden": 64, "layers": 2, "heads": 2}
SFT = {"steps": 250, "batch": 32, "lr": 3e-3}
# the reward model: its first steps on wrong-noun pairs alone (rlsteps.tiny.preferences.NOUN_FIRST), then 64 pairs a
# step, 8 of them ties (rlsteps.tiny.preferences.neutral_tie); a pair's margin is margin_per_reward times its true
# reward's gap, plus fault_worth where only the rejected answer has a fault (rlsteps.tiny.training.reward_gap). With the
# margins, 700 steps left one more positive adjective scoring higher in only 75-82% of probes on world seed 0.
RM = {
    "steps": 900,
    "batch": 64,
    "lr": 3e-3,
    "heldout_pairs": 512,
    "noun_first_steps": 100,
    "tie_pairs": 8,
    "margin_per_reward": 2.0,
    "fault_worth": 1.0,
}
EVAL = {"samples": 128, "max_new_tokens": 32}
INIT_STD = 0.1  # larger than the usual 0.02: tiny widths then learn to copy the noun within a few hundred steps
PROMPTS = {"train": 256, "val": 32}
