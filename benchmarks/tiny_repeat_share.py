"""How readily the tiny world's SFT policy says again the adjective it just said, where it is about to say a positive
one: the share r = p(the adjective just said) / (that + p(a positive adjective not yet said)), read from the policy's
next-token distribution (teacher-forced, no sampling) after each positive adjective, said after 0-2 others in any order.

RL moves the policy towards lists of positive adjectives, and raises their chances alike; r is what it keeps of the
SFT policy's reluctance to repeat, so a policy that comes to fill its list with positives says the last one again at
about r per place. Any order, not only the SFT data's alphabetical one: a policy moved by RL goes on after "wonderful",
which that order never does (benchmarks/README.md, tiny_learning.py: why the policy's SFT has an unlikelihood term, and
why it reads lists in any order too).

    python benchmarks/tiny_repeat_share.py                 # world seeds 0 1 2 (built first where missing)
    python benchmarks/tiny_repeat_share.py --worlds 0 --policy PATH
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlsteps.tiny.build import ensure_tiny_world
from rlsteps.tiny.evaluate import repeat_shares

PLACES = 25  # places after each of the 12 positive adjectives


def repeat_shares_of(policy_dir: Path, places: int = PLACES, seed: int = 0) -> dict[str, list[float]]:
    policy = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    return repeat_shares(policy, AutoTokenizer.from_pretrained(policy_dir), random.Random(seed), places)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--policy", type=Path, help="another policy folder to measure, in place of each world's")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for world in args.worlds:
        shares = repeat_shares_of(args.policy or ensure_tiny_world(world).policy)
        every = sum(shares.values(), [])
        medians = {adjective: statistics.median(values) for adjective, values in shares.items()}
        worst = max(medians, key=medians.get)
        print(
            f"world {world}: r median {statistics.median(every):.4f}, mean {statistics.mean(every):.4f}; "
            f"highest after one adjective: {worst} {medians[worst]:.4f} (median of its places)"
        )


if __name__ == "__main__":
    main()
