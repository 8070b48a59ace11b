"""Write the verifiable example's prompts: questions with a known one-word answer, train and validation disjoint.

    python -m rlsteps.examples.verifiable.make_prompts      (rewrites train.jsonl and val.jsonl beside this file)

Each line is {"id", "messages": [...], "answer": ...}; the answer reaches the reward function
(rlsteps.engine.rewards.verifiable:exact_match) as its `answer` keyword. Four kinds of question, each asking for the
answer alone: capitals, opposites, colours of things and small sums. The messages show the format once: a question of
the same kind answered in one word (a question in neither split), then the question. Without that example
SmolLM2-135M-Instruct answers in a sentence ("The capital of Egypt is Cairo.") and greedy exact match is 0%; with
it, about a quarter of the validation answers match and RL has room to teach the rest. Deterministic (a fixed seed):
the files shipped are what this writes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20261125
VAL_PER_KIND = 16

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Greenland": "Nuuk",
    "Spain": "Madrid",
    "Japan": "Tokyo",
    "Russia": "Moscow",
    "Egypt": "Cairo",
    "Greece": "Athens",
    "Portugal": "Lisbon",
    "Austria": "Vienna",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Ireland": "Dublin",
    "Poland": "Warsaw",
    "Hungary": "Budapest",
    "Peru": "Lima",
    "Kenya": "Nairobi",
    "Thailand": "Bangkok",
    "China": "Beijing",
    "Cuba": "Havana",
    "Belgium": "Brussels",
    "Netherlands": "Amsterdam",
    "Turkey": "Ankara",
    "Canada": "Ottawa",
    "Australia": "Canberra",
    "Argentina": "Buenos Aires",
    "Chile": "Santiago",
    "Iran": "Tehran",
    "Iraq": "Baghdad",
    "Mexico": "Mexico City",
    "Ukraine": "Kyiv",
    "Romania": "Bucharest",
    "Vietnam": "Hanoi",
    "Indonesia": "Jakarta",
    "Philippines": "Manila",
    "Colombia": "Bogota",
    "Venezuela": "Caracas",
    "Ethiopia": "Addis Ababa",
    "Nigeria": "Abuja",
    "Morocco": "Rabat",
    "Switzerland": "Bern",
    "Czechia": "Prague",
    "Syria": "Damascus",
    "Lebanon": "Beirut",
    "South Korea": "Seoul",
    "India": "New Delhi",
    "Pakistan": "Islamabad",
    "Iceland": "Reykjavik",
}
OPPOSITES = {
    "hot": "cold",
    "big": "small",
    "fast": "slow",
    "up": "down",
    "happy": "sad",
    "light": "dark",
    "open": "closed",
    "young": "old",
    "rich": "poor",
    "hard": "soft",
    "early": "late",
    "full": "empty",
    "wet": "dry",
    "strong": "weak",
    "high": "low",
    "day": "night",
    "left": "right",
    "good": "bad",
    "in": "out",
    "thick": "thin",
    "loud": "quiet",
    "win": "lose",
    "push": "pull",
    "true": "false",
    "clean": "dirty",
    "heavy": "light",
    "long": "short",
    "first": "last",
    "above": "below",
    "buy": "sell",
    "alive": "dead",
    "cheap": "expensive",
    "inside": "outside",
    "north": "south",
    "east": "west",
    "before": "after",
    "front": "back",
    "arrive": "leave",
    "sweet": "sour",
    "love": "hate",
    "question": "answer",
    "friend": "enemy",
    "begin": "end",
    "always": "never",
    "maximum": "minimum",
    "on": "off",
    "yes": "no",
    "black": "white",
    "top": "bottom",
    "laugh": "cry",
}
COLOURS = {
    "a banana": "yellow",
    "grass": "green",
    "the sky on a clear day": "blue",
    "snow": "white",
    "coal": "black",
    "a ripe tomato": "red",
    "an orange": "orange",
    "a lemon": "yellow",
    "milk": "white",
    "a strawberry": "red",
    "a carrot": "orange",
    "a lime": "green",
    "blood": "red",
    "chocolate": "brown",
    "a polar bear": "white",
    "a crow": "black",
    "an emerald": "green",
    "a sapphire": "blue",
    "a ruby": "red",
    "the sun": "yellow",
    "a cucumber": "green",
    "an eggplant": "purple",
    "a flamingo": "pink",
    "ash": "gray",
    "a pumpkin": "orange",
    "a fire truck": "red",
    "a frog": "green",
    "a school bus": "yellow",
    "a panda's fur": "black and white",
    "an elephant": "gray",
    "a mouse": "gray",
    "a cherry": "red",
    "a pea": "green",
    "the ocean": "blue",
    "a zebra's stripes": "black",
    "coffee": "brown",
    "an egg yolk": "yellow",
    "a lettuce leaf": "green",
    "cream": "white",
    "a raven": "black",
    "soil": "brown",
    "a blueberry": "blue",
    "a lavender flower": "purple",
    "a swan": "white",
    "a leaf in summer": "green",
    "a canary": "yellow",
    "wood": "brown",
    "a plum": "purple",
    "ink": "black",
    "a brick": "red",
}
COLOUR_ALTERNATIVES = {"gray": ["gray", "grey"]}
EXAMPLES = {  # kind: (question, answer), shown before every question of that kind; in neither split
    "capital": ("What is the capital of Italy? Answer with the city's name only.", "Rome"),
    "opposite": ('What is the opposite of the word "wide"? Answer with one word only.', "narrow"),
    "colour": ("What colour is a tangerine? Answer with one word only.", "orange"),
    "sum": ("What is 3+4? Answer with a number only.", "7"),
}


def questions() -> dict[str, list[tuple[str, str | list[str]]]]:
    rng = random.Random(SEED)
    capitals = [
        (f"What is the capital of {country}? Answer with the city's name only.", city)
        for country, city in CAPITALS.items()
        if " " not in city  # one word
    ]
    opposites = [
        (f'What is the opposite of the word "{word}"? Answer with one word only.', opposite)
        for word, opposite in OPPOSITES.items()
    ]
    colours = [
        (f"What colour is {thing}? Answer with one word only.", COLOUR_ALTERNATIVES.get(colour, colour))
        for thing, colour in COLOURS.items()
        if " " not in colour
    ]
    sums, seen = [], set()
    while len(sums) < 50:
        a, b = rng.randint(2, 19), rng.randint(2, 19)
        if (a, b) not in seen and (a, b) != (3, 4):
            seen.add((a, b))
            sums.append((f"What is {a}+{b}? Answer with a number only.", str(a + b)))
    return {"capital": capitals, "opposite": opposites, "colour": colours, "sum": sums}


def splits() -> tuple[list[dict], list[dict]]:
    rng = random.Random(SEED)
    train, val = [], []
    for kind, items in questions().items():
        items = list(items)
        rng.shuffle(items)
        for index, (question, answer) in enumerate(items):
            shown, shown_answer = EXAMPLES[kind]
            messages = [
                {"role": "user", "content": shown},
                {"role": "assistant", "content": shown_answer},
                {"role": "user", "content": question},
            ]
            row = {"id": f"{kind}-{index:02d}", "messages": messages, "answer": answer}
            (val if index < VAL_PER_KIND else train).append(row)
    rng.shuffle(train)
    return train, val


def main() -> None:
    train, val = splits()
    for name, rows in (("train", train), ("val", val)):
        with open(HERE / f"{name}.jsonl", "w") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
        print(f"{name}.jsonl: {len(rows)} prompts")


if __name__ == "__main__":
    main()
