"""How readily the tiny world's SFT policy says again the adjective it just said, where it is about to say a positive
one: the share r = p(the adjective just said) / (that + p(a positive adjective not yet said)) at each place of
positive-only task sentences, read from the policy's next-token distribution (teacher-forced, no sampling).

RL moves the policy towards lists of positive adjectives, and raises their chances alike; r is what it keeps of the
SFT policy's reluctance to repeat, so a policy that comes to fill its list with positives says the last one again at
about r per place (benchmarks/README.md, tiny_learning.py: why the policy's SFT has an unlikelihood term).

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

from rlsteps.tiny import task
from rlsteps.tiny.build import ensure_tiny_world
from rlsteps.tiny.tokenizer import chat_prompt

PLACES = 300  # places in positive lists, each after 1-3 positive adjectives already said


def repeat_shares(policy_dir: Path, places: int = PLACES, seed: int = 0) -> list[float]:
    policy = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    token = {word: one_token(tokenizer, word) for word in task.POSITIVE}
    rng, positives, shares = random.Random(seed), sorted(task.POSITIVE), []
    for _ in range(places):
        prompt, noun = task.sample_prompt(rng)
        said = sorted(rng.sample(positives, 4))[: rng.randrange(1, 4)]
        joiner = " and" if len(said) == 3 and rng.random() < 0.5 else ","
        text = chat_prompt(tokenizer, prompt) + f"The {noun} {rng.choice(task.VERBS)} {', '.join(said)}{joiner}"
        with torch.no_grad():
            encoded = tokenizer(text, return_tensors="pt", add_special_tokens=False)
            p = policy(**encoded).logits[0, -1].float().softmax(-1)
        again = p[token[said[-1]]].item()
        fresh = sum(p[token[word]].item() for word in positives if word not in said)
        shares.append(again / (again + fresh))
    return shares


def one_token(tokenizer, word: str) -> int:
    """The id of " word", which the tiny tokenizer keeps whole (a word split in pieces would be read by its first)."""
    pieces = tokenizer.tokenize(f" {word}")
    if len(pieces) != 1:
        raise SystemExit(f"{word!r} is {len(pieces)} tokens in this tokenizer ({pieces}); r reads one token per word")
    return tokenizer.convert_tokens_to_ids(pieces[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--policy", type=Path, help="another policy folder to measure, in place of each world's")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for world in args.worlds:
        shares = repeat_shares(args.policy or ensure_tiny_world(world).policy)
        print(f"world {world}: r median {statistics.median(shares):.4f}, mean {statistics.mean(shares):.4f}")


if __name__ == "__main__":
    main()
