"""The tiny world's recipe: sizes, steps and learning rates.

Changing any of it changes the world: bump TINY_WORLD_VERSION (rlsteps.tiny.layout), part of the cache key.
"""

BUILD_THREADS = 1  # fixed, so the weights do not depend on the machine; also the fastest on a shared CPU
TOKENIZER_VOCAB = 640  # an upper bound: the merges run out near 580, with every task word one token
POLICY_SIZE = {"hidden": 64, "layers": 2, "heads": 2}  # head_dim 32: the smallest vLLM's CPU attention serves
SFT = {"steps": 250, "batch": 32, "lr": 3e-3}
RM = {"steps": 600, "batch": 32, "lr": 3e-3, "heldout_pairs": 512}
EVAL = {"samples": 128, "max_new_tokens": 32}
INIT_STD = 0.1  # larger than the usual 0.02: tiny widths then learn to copy the noun within a few hundred steps
PROMPTS = {"train": 256, "val": 32}
