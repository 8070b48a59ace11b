"""The measures the learning tests read a trained policy's answers with (policy_speech.py), each shown to fail on a
deliberately bad set of answers: answers that never end, a bag of liked words, a liked word repeated, another noun,
one answer for every prompt. The baseline is the SFT distribution itself (rlsteps.tiny.task.sample_response)."""

import random

import pytest

from policy_speech import measure, regressions, well_formed
from rlsteps.tiny import task as tiny_task

PROMPTS = [phrasing.format(noun=noun) for noun, phrasing in zip(tiny_task.NOUNS[:32], tiny_task.PROMPT_PHRASINGS * 4)]


def answers(respond, samples_per_prompt: int = 4, ended: bool = True) -> list[tuple[str, str, bool]]:
    rng = random.Random(0)
    return [(p, respond(rng, tiny_task.prompt_noun(p)), ended) for p in PROMPTS * samples_per_prompt]


SFT = measure(answers(tiny_task.sample_response))
LEARNED = measure(answers(lambda rng, noun: tiny_task.sample_response(rng, noun, p_positive=0.9)))


@pytest.mark.parametrize(
    "prompt, response, expected",
    [
        ("Describe the cat.", "The cat is kind, lovely, bright and gentle.", True),
        ("Describe the cat.", "It looks plain.", True),
        ("What do you think of the lake?", "The lake seems ugly and old.", True),
        ("Describe the cat.", "The dog is kind.", False),  # another noun
        ("Describe the cat.", "The cat is kind, lovely, bright, gentle and charming.", False),  # five adjectives
        ("Describe the cat.", "The cat is round, round and round.", False),  # an adjective repeated
        ("Describe the cat.", "The cat is kind, purple and bright.", False),  # not a task adjective
        ("Describe the cat.", "The cat is kind, lovely", False),  # cut off
        ("Describe the cat.", "kind lovely bright gentle", False),  # a bag of liked words
        ("Describe the cat.", "The cat is kind. The cat is lovely.", False),  # two sentences
        ("Describe the cat.", "", False),
    ],
)
def test_a_well_formed_answer_is_the_tasks_sentence_about_the_prompts_noun(prompt, response, expected):
    assert well_formed(prompt, response) is expected


def test_the_sft_distribution_is_well_formed_and_a_policy_that_learned_the_preference_loses_nothing():
    assert SFT.ended == 1.0 and SFT.well_formed == 1.0 and SFT.repeated == 0.0 and SFT.words_used > 1.1, SFT
    assert regressions(LEARNED, SFT) == [] and regressions(SFT, SFT) == []
    assert tiny_task.true_reward(PROMPTS[0], "lovely lovely lovely") > tiny_task.true_reward(PROMPTS[0], "It is dull.")


@pytest.mark.parametrize(
    "respond, ended, failing",
    [
        (lambda rng, noun: tiny_task.sample_response(rng, noun, 0.9)[:-1], False, ["ended", "well_formed"]),
        (
            lambda rng, noun: " ".join(rng.sample(tiny_task.POSITIVE, 4)),
            True,
            ["well_formed", "words_used"],
        ),  # a bag of liked words
        (lambda rng, noun: " ".join(["lovely"] * rng.randint(2, 12)), True, ["well_formed", "repeated", "words_used"]),
        (lambda rng, noun: f"The {noun} is lovely, lovely and kind.", True, ["well_formed", "repeated"]),
        (lambda rng, noun: f"The {'dog' if noun != 'dog' else 'cat'} is kind.", True, ["well_formed", "words_used"]),
        (lambda rng, noun: "It is kind, lovely, bright and gentle.", True, ["words_used"]),  # one answer for all
    ],
    ids=[
        "never-ends",
        "bag-of-liked-words",
        "a-liked-word-repeated",
        "repeated-in-a-sentence",
        "another-noun",
        "alike",
    ],
)
def test_each_measure_fails_on_answers_that_game_the_true_reward(respond, ended, failing):
    bad = measure(answers(respond, ended=ended))
    worse = regressions(bad, SFT)
    assert [line.split(":")[0] for line in worse] == failing, (bad, worse)
