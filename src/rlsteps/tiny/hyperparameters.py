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
# 750 steps, not 250: the SFT data says its adjectives in alphabetical order, and the longer the policy learns that
# rule the less RL's push towards positive adjectives breaks it. After 250, every recipe's sampled answers at world
# seed 0 came to say a word again 2-6 times as often as the SFT policy's (up to 44% of them, rl/rs greedy answers too:
# "The tree is cheerful, friendly, friendly and wonderful."); after 750, rl/reinforce's no more often
# repeat_unlikelihood: the weight of the policy's unlikelihood term on the adjectives its response has already said
# (rlsteps.tiny.training.repeat_unlikelihood_loss; the reward model's backbone has none). With NLL alone the SFT
# policy gave the adjective just said 4.2-5.3% of the positive adjectives' chance at each place of a list, RL lifted it
# with the others, and the sampled answers at the end said a word again 5-16% of the time in 20 of 45 runs
# (benchmarks/tiny_learning.py, world v17). At 20 that share is 0.16-0.17% (at 5: 0.8-1.0%), and 3 of 45 runs say a
# word again more than 3 points more often than their SFT policy, by 4.9 at most (world v20).
# unordered_rows: answers in any order a step, for that term alone (rlsteps.tiny.training.RepeatUnlikelihood). On the
# SFT data alone the term never sees a list go on after "wonderful" (last in alphabetical order), and there the v20
# policy said it again 40% of the time (world 0; 12% on world 1), which is the "..., wonderful and wonderful." RL then
# lifted; with 32 rows the most for any adjective is 1.7% (world 0; 2.3% on world 1), at 16 6.2%; the NLL is unchanged
SFT = {
    "policy_steps": 750,
    "backbone_steps": 750,
    "batch": 32,
    "lr": 3e-3,
    "repeat_unlikelihood": 20.0,
    "unordered_rows": 32,
}
# the reward model: its first steps on wrong-noun pairs alone (rlsteps.tiny.preferences.NOUN_FIRST), then 64 pairs a
# step, 8 of them ties (rlsteps.tiny.preferences.neutral_tie); a pair's margin is margin_per_reward times the gap of
# its answers' words (rlsteps.tiny.task.words_score), plus fault_worth where only the rejected answer has a fault
# (rlsteps.tiny.training.reward_gap). A fault is worth three positive adjectives: at one, the reward model scored an
# answer that says a positive adjective again above a sentence with one positive fewer, and rejection sampling, which
# keeps the best-scored answer, taught the policy to repeat. 1500 steps: at 900, with the faults' larger margins, one
# more positive adjective scored higher in only 78-91% of probes on world seed 0 (99-100% at 1500)
RM = {
    "steps": 1500,
    "batch": 64,
    "lr": 3e-3,
    "heldout_pairs": 512,
    "noun_first_steps": 100,
    "tie_pairs": 8,
    "margin_per_reward": 2.0,
    "fault_worth": 3.0,
    "judge_scale_answers": 512,  # answers whose rewards' spread the judge reads rewards by (training.judge_scale)
}
EVAL = {"samples": 128, "max_new_tokens": 32}
INIT_STD = 0.1  # larger than the usual 0.02: tiny widths then learn to copy the noun within a few hundred steps
PROMPTS = {"train": 256, "val": 32}
