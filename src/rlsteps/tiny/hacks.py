"""Reward functions that pay for something other than a good answer: terms a policy learns to game, for showing what
reward hacking looks like in a run (logging.reward_hacking) and what stops it.

Each is a reward function of the usual protocol (rlsteps.engine.rewards.functions): the prompt as chat messages (or
its text), then the response. Add one beside the reward model:

    rlsteps run rl/reinforce -c tiny rewards.hack.function=rlsteps.tiny.hacks:per_word rewards.hack.weight=100 \
        train.lr=3e-3

- `per_word` pays for length: the policy learns to list adjectives past the task's four and never to end;
- `per_repeat` pays for a word said again: the policy learns to say one adjective over and over.

The tiny reward model's scores span tens, and the tiny policy holds to its sentence, so a hack needs a large weight
and a rate that moves the policy off the sentence: at weight 100 and train.lr=3e-3 the per-word term takes over most
rollouts of rl/reinforce `-c tiny` at step 6 on the tiny world v21 (tests/test_reward_terms_runs.py; at 4e-3 on v20 by
step 5, so wholly that no rollout ended and the run stopped); at the config's own rate it only fills the sentence's
four adjectives in 12 steps, and at weight 30 on the tiny world v17 neither hack took over in 10. The per-repeat term
needs weight 300 on v21, whose policy's SFT pushes down a word said again in lists of any order: at 100 it never took
over in 10 steps.

A word is what lies between spaces, its punctuation and case aside ("Kind," and "kind." are one word), as the watch
counts words said again. Torch-free.
"""

from __future__ import annotations

from rlsteps.engine.records.reward_hacking import said_words


def per_word(messages: str | list[dict[str, str]], response: str) -> float:
    """One for each word of the response, whatever it says."""
    return float(len(said_words(response)))


def per_repeat(messages: str | list[dict[str, str]], response: str) -> float:
    """One for each word said again ("kind, kind and kind": two)."""
    said = said_words(response)
    return float(len(said) - len(set(said)))
