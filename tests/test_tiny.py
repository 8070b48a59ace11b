"""The offline tiny world: cached atomic build, standard HF files, a learnable task, a reward model that knows it."""

import hashlib
import json
import math
import random
import re
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

import policy_speech
from rlsteps.engine.rewards.judge.scale import DEFAULT_SCALE, JUDGE_SCALE_KEY, reward_scale_of
from rlsteps.tiny import build, evaluate, hyperparameters, preferences, training
from rlsteps.tiny import task as tiny_task
from rlsteps.tiny.build import ensure_tiny_world, load_tiny_world
from rlsteps.tiny.layout import TINY_WORLD_VERSION, rlsteps_home, tiny_world_dir
from rlsteps.tiny.models import build_random_causal_lm
from rlsteps.tiny.task import BEST_TRUE_REWARD, true_reward
from rlsteps.tiny.tokenizer import chat_prompt, train_tokenizer

RESPONSE_FORMAT = re.compile(r"^(The [a-z]+|It) (is|looks|seems) [a-z]+((, [a-z]+)* and [a-z]+)?\.$")


# --- the built world ----------------------------------------------------------------------------


def test_the_world_is_built_and_a_second_call_returns_it_without_rebuilding(tiny_world, monkeypatch):
    for path in (tiny_world.policy, tiny_world.reward_model, tiny_world.train_prompts, tiny_world.val_prompts):
        assert path.exists(), path
    metadata = json.loads((tiny_world.root / "world.json").read_text())
    assert metadata["version"] == TINY_WORLD_VERSION and metadata["seed"] == 0
    assert "Hidden preference" in (tiny_world.root / "README.md").read_text()

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a built world was built again")

    monkeypatch.setattr(build, "_build_world", no_rebuild)
    started = time.perf_counter()
    assert ensure_tiny_world(seed=0, home=rlsteps_home()) == tiny_world
    assert time.perf_counter() - started < 1.0


def test_models_and_tokenizer_load_with_the_auto_classes(tiny_world):
    tokenizer = AutoTokenizer.from_pretrained(tiny_world.policy)
    assert tokenizer.pad_token == "<|pad|>" and tokenizer.eos_token == "<|end|>"
    assert 400 <= len(tokenizer) <= 1000
    policy = AutoModelForCausalLM.from_pretrained(tiny_world.policy)
    reward_model = AutoModelForSequenceClassification.from_pretrained(tiny_world.reward_model)
    assert policy.config.model_type == reward_model.config.model_type == "llama"
    assert policy.config.pad_token_id == reward_model.config.pad_token_id == tokenizer.pad_token_id
    assert policy.config.eos_token_id == tokenizer.eos_token_id and reward_model.config.num_labels == 1
    assert policy.get_input_embeddings().num_embeddings == len(tokenizer)
    assert 100_000 < sum(p.numel() for p in policy.parameters()) < 2_000_000
    tokenizer_json = (tiny_world.root / "tokenizer" / "tokenizer.json").read_bytes()
    for folder in (tiny_world.policy, tiny_world.reward_model):
        assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.bin"))
        assert (folder / "tokenizer.json").read_bytes() == tokenizer_json
        config = json.loads((folder / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # readable by older transformers too


def test_the_policy_is_also_a_megatron_checkpoint_with_the_same_weights(tiny_world):
    from rlsteps.engine.policy.model import load_policy

    hf, hf_tokenizer = load_policy(tiny_world.policy)
    megatron, megatron_tokenizer = load_policy(tiny_world.policy_megatron)
    assert (tiny_world.policy_megatron / "iter_0000000" / "metadata.json").is_file()
    expected, got = hf.state_dict(), megatron.state_dict()
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    assert megatron_tokenizer("Describe the castle.").input_ids == hf_tokenizer("Describe the castle.").input_ids
    assert megatron_tokenizer.chat_template == hf_tokenizer.chat_template


def test_chat_template_renders_roles_and_the_assistant_header(tiny_world):
    tokenizer = AutoTokenizer.from_pretrained(tiny_world.reward_model)
    chat = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Describe the cat."},
        {"role": "assistant", "content": "The cat is kind."},
    ]
    rendered = tokenizer.apply_chat_template(chat, tokenize=False)
    assert rendered == (
        "<|system|>\nBe kind.<|end|><|user|>\nDescribe the cat.<|end|><|assistant|>\nThe cat is kind.<|end|>"
    )
    prompt = tokenizer.apply_chat_template(chat[1:2], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|user|>\nDescribe the cat.<|end|><|assistant|>\n"
    assert rendered.endswith(tokenizer.eos_token)  # the assistant's turn ends with EOS
    with pytest.raises(Exception, match="roles are system, user and assistant"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)
    # Role markers are single tokens, and encoding adds no BOS: a server that tokenises with defaults agrees.
    ids = tokenizer(rendered)["input_ids"]
    assert ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|system|>") and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "\nBe kind.\nDescribe the cat.\nThe cat is kind."


def test_prompt_files_are_disjoint_user_turns_about_task_nouns(tiny_world):
    train = [json.loads(line) for line in tiny_world.train_prompts.read_text().splitlines()]
    val = [json.loads(line) for line in tiny_world.val_prompts.read_text().splitlines()]
    assert (len(train), len(val)) == (256, 32)
    for record in train + val:
        assert set(record) == {"id", "messages"} and len(record["messages"]) == 1
        assert record["messages"][0]["role"] == "user"
        assert tiny_task.prompt_noun(record["messages"][0]["content"]) in tiny_task.NOUNS
    assert not {r["id"] for r in train} & {r["id"] for r in val}
    assert not {r["messages"][0]["content"] for r in train} & {r["messages"][0]["content"] for r in val}


# --- the policy and the reward model -------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tiny_world):
    tokenizer = AutoTokenizer.from_pretrained(tiny_world.policy)
    policy = AutoModelForCausalLM.from_pretrained(tiny_world.policy).eval()
    reward_model = AutoModelForSequenceClassification.from_pretrained(tiny_world.reward_model).eval()
    return tokenizer, policy, reward_model


@pytest.fixture(scope="module")
def sft_samples(models, tiny_world):
    """96 (user prompt, rendered prompt, response, ended) from the SFT policy at temperature 1."""
    tokenizer, policy, _ = models
    val = [json.loads(line)["messages"][0]["content"] for line in tiny_world.val_prompts.read_text().splitlines()]
    prompts = val * 3
    rendered = [chat_prompt(tokenizer, p) for p in prompts]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        samples = evaluate.sample_responses(policy, tokenizer, rendered, max_new_tokens=32)
    return [(p, r, text, ended) for p, r, (text, ended) in zip(prompts, rendered, samples)]


def test_sft_samples_end_with_eos_look_like_the_task_and_leave_room_to_improve(sft_samples):
    responses = [text for _, _, text, _ in sft_samples]
    assert sum(ended for *_, ended in sft_samples) / len(sft_samples) > 0.9
    assert sum(bool(RESPONSE_FORMAT.match(text)) for text in responses) / len(responses) > 0.8, responses[:8]
    assert len(set(responses)) > len(responses) // 2  # varied, not one memorised answer
    rewards = [true_reward(prompt, text) for prompt, _, text, _ in sft_samples]
    mentions = [tiny_task.prompt_noun(prompt) in tiny_task.words(text) for prompt, _, text, _ in sft_samples]
    assert 0.3 < sum(mentions) / len(mentions) < 0.9  # copies the noun, but not always
    assert -0.5 < sum(rewards) / len(rewards) < BEST_TRUE_REWARD - 1.5


def test_sft_greedy_answers_are_the_tasks_sentence_and_repeat_no_adjective(models, tiny_world):
    """Greedy is how the recipes validate: the SFT policy's greedy answers are well formed from the start."""
    tokenizer, policy, _ = models
    val = [json.loads(line)["messages"][0]["content"] for line in tiny_world.val_prompts.read_text().splitlines()]
    greedy = evaluate.sample_responses(policy, tokenizer, [chat_prompt(tokenizer, p) for p in val], greedy=True)
    assert all(ended and RESPONSE_FORMAT.match(text) for text, ended in greedy), greedy
    adjectives = [[w for w in tiny_task.words(text) if w in tiny_task.ADJECTIVES] for text, _ in greedy]
    assert all(len(set(a)) == len(a) for a in adjectives), greedy
    assert all(a == sorted(a) for a in adjectives), greedy  # as the SFT data says them


@pytest.mark.learned_reward_model
def test_reward_model_ranks_held_out_preference_pairs(models):
    tokenizer, _, reward_model = models
    pairs = preferences.preference_pairs(random.Random(2024), 256)  # the build draws pairs from seed 0 and 1
    assert evaluate.pair_accuracy(reward_model, tokenizer, pairs) > 0.9


@pytest.mark.learned_reward_model
@pytest.mark.parametrize(
    "better, worse",
    [
        ("The cat is bright, gentle, kind and lovely.", "The cat is round, round and round."),  # neutral repeated
        ("The cat is bright, gentle, kind and lovely.", "The cat is large, large, large and round."),
        ("The cat is bright, gentle, kind and lovely.", "The cat is kind, kind, kind and kind."),  # positive repeated
        ("The cat is gentle and kind.", "The cat is kind, kind and kind."),
        ("The cat is bright, delightful, gentle and large.", "The cat is bright, delightful, delightful and large."),
        ("The cat is kind.", "The cat is large, old, round and tall."),  # a list of neutral ones
        ("The cat is kind.", "The cat is round."),  # positive over neutral
        ("The cat is gentle and kind.", "The cat is gentle and round."),
        ("The cat is bright, gentle, kind and lovely.", "The cat is bright, kind, lovely and round."),
        ("The cat is bright, gentle, kind and lovely.", "The cat is bright, kind, large, old, round, tall and lovely."),
        ("The cat is bright, gentle, kind and lovely.", "It is bright, gentle, kind and lovely."),
        ("The cat is bright, gentle, kind and lovely.", "kind kind kind kind kind kind"),
        # the forms a judge over the v20 reward model let GRPO lift: the noun and the verb left out, the verb left
        # out, and the sentence started again and run together
        ("It is bright, gentle, kind and lovely.", "The bright, gentle, kind and lovely."),
        ("The cat is bright, gentle, kind and lovely.", "The cat bright, gentle, kind and lovely."),
        (
            "The cat is bright, gentle, kind and lovely.",
            "The cat looks brightThe cat looks bright looks brightThe cat seems bright, gentle, kind and lovely.",
        ),
    ],
)
def test_reward_model_prefers_positive_adjectives_over_neutral_ones_and_over_repetition(models, better, worse):
    """The answers a policy that games the reward model finds (the tiny world v6's reward model scored "The cat is
    round, round and round." far above "The cat is kind."), each under a truly better one."""
    tokenizer, _, reward_model = models
    assert true_reward("Describe the cat.", better) > true_reward("Describe the cat.", worse)
    assert evaluate.pair_accuracy(reward_model, tokenizer, [("Describe the cat.", better, worse)]) == 1.0


@pytest.mark.learned_reward_model
def test_reward_model_checks_the_noun_against_the_prompts_and_counts_positive_adjectives_up_to_four(models):
    """Probes of the answers the v8 world's policies gamed its reward model with: the same answer naming another noun
    than the prompt's (which v8's scored at least as high in 54% of 200), and one more positive adjective, from one
    neutral adjective up to four positive ones (v8's preferred "The house seems brilliant and kind." to "The house is
    kind, lovely, bright and gentle.")."""
    tokenizer, _, reward_model = models
    rng = random.Random(2026)  # the build's pairs and its own probes come from seeds 0 and 1
    probes = evaluate.wrong_noun_probes(rng, 200)
    assert all(
        tiny_task.faults(p, wrong) == ["a wrong noun"] and not tiny_task.faults(p, right) for p, right, wrong in probes
    )
    wrong_at_least_as_high = 1.0 - evaluate.pair_accuracy(reward_model, tokenizer, probes)
    assert wrong_at_least_as_high <= 0.1
    climbs = evaluate.ladder_climbs(reward_model, tokenizer, evaluate.positive_ladders(rng, 200))
    assert len(climbs) == 4 and min(climbs) >= 0.9, climbs  # neutral -> 1 positive -> 2 -> 3 -> 4
    four = (
        "Describe the house.",
        "The house is bright, gentle, kind and lovely.",
        "The house seems brilliant and kind.",
    )
    assert evaluate.pair_accuracy(reward_model, tokenizer, [four]) == 1.0


@pytest.mark.learned_reward_model
@pytest.mark.parametrize("kind", ["repeated", "neutral or long", "positive over neutral"])
def test_reward_model_ranks_held_out_hard_negatives_of_each_kind(models, kind):
    tokenizer, _, reward_model = models
    rng = random.Random(2025)
    if kind == "positive over neutral":
        pairs = [
            (p, a, b) if true_reward(p, a) > true_reward(p, b) else (p, b, a)
            for p, a, b in (preferences.swapped_pair(rng) for _ in range(400))
            if set(tiny_task.words(a)) ^ set(tiny_task.words(b)) <= tiny_task.POSITIVE_OR_NEUTRAL
            and true_reward(p, a) != true_reward(p, b)
        ]
    else:
        padded = [preferences.padded_negative(rng) for _ in range(400)]
        pairs = [
            (p, good, bad)
            for p, good, bad in padded
            if preferences.preferred(p, good, bad)
            and (len(set(tiny_task.words(bad))) < len(tiny_task.words(bad))) == (kind == "repeated")
        ]
    assert len(pairs) > 50
    assert evaluate.pair_accuracy(reward_model, tokenizer, pairs) > 0.9


@pytest.mark.learned_reward_model
def test_reward_model_scores_correlate_with_true_reward_on_sft_samples(models, sft_samples):
    """On the SFT policy's faultless samples: a faulty one (a wrong noun, a broken word, a word said again: about one
    in ten) has faults the true reward does not see, which the reward model learnt to score down."""
    tokenizer, _, reward_model = models
    faultless = [sample for sample in sft_samples if not tiny_task.faults(sample[0], sample[2])]
    assert len(faultless) > 0.8 * len(sft_samples)
    prompts, rendered, responses, _ = zip(*faultless)
    with torch.no_grad():
        scores = training.reward_scores(reward_model, tokenizer, list(rendered), list(responses))
    true = torch.tensor([true_reward(p, r) for p, r in zip(prompts, responses)])
    pearson = torch.corrcoef(torch.stack([scores, true]))[0, 1].item()
    spearman = torch.corrcoef(torch.stack([_ranks(scores), _ranks(true)]))[0, 1].item()
    # world v21: 0.81 and 0.79 (its reward model also learns the forms it scores far down: the sentence restarted and
    # run together, the noun and the verb left out)
    assert pearson > 0.8 and spearman > 0.75, (pearson, spearman)


def test_reward_model_scores_exactly_the_shared_reward_input_text(models):
    from rlsteps.engine.rewards.text import reward_input_text

    tokenizer, _, reward_model = models
    rendered = chat_prompt(tokenizer, "Describe the cat.")
    text = reward_input_text(rendered, "The cat is kind.", tokenizer.eos_token)
    with torch.no_grad():
        direct = reward_model(**tokenizer([text], return_tensors="pt")).logits[0, 0]
        helper = training.reward_scores(reward_model, tokenizer, [rendered], ["The cat is kind."])[0]
    assert torch.equal(direct, helper)


def _ranks(values: torch.Tensor) -> torch.Tensor:
    return values.argsort().argsort().float()


# --- the task -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt, response, expected",
    [
        ("Describe the cat.", "The cat is kind, lovely, bright and gentle.", 3.0),  # the best
        ("Describe the cat.", "It is kind.", 0.5),
        ("What do you think of the lake?", "The lake seems ugly and old.", 0.5),  # neutral counts 0
        ("Describe the cat.", "It is ugly, dull and awful.", -1.5),  # every negative counts
        ("<|user|>\nDescribe the cat.<|end|><|assistant|>\n", "The cat is plain.", 1.0),  # rendered prompt
        # anything but the task's sentence: its words' sum capped at 0.0
        ("Describe the cat.", "The cat is kind, lovely, bright, gentle and charming.", 0.0),  # five adjectives
        ("Describe the cat.", "The cat is kind, kind and kind.", 0.0),  # a word said again
        ("Describe the cat.", "It is ugly, ugly and dull.", -1.5),  # negatives still cost
        ("Describe the cat.", "The dog is kind.", 0.0),  # the wrong noun
        ("Describe the tower.", "The tower is brilliant, delightful, kind wonderful.", 0.0),  # no "and"
        ("Describe the cat.", "The cat is kind, lovely and bright", 0.0),  # no full stop
        ("Describe the cat.", "The cat is kind. The cat is lovely.", 0.0),  # two sentences
        ("Describe the cat.", "THE CAT IS KIND.", 0.0),
        ("Describe the cat.", " ".join(["lovely"] * 12), 0.0),  # a liked word, on and on
        ("Describe the cat.", "", 0.0),
    ],
)
def test_true_reward_on_hand_examples(prompt, response, expected):
    assert true_reward(prompt, response) == expected


def test_true_reward_needs_a_task_noun_in_the_prompt():
    with pytest.raises(ValueError, match="no task noun"):
        true_reward("Describe the weather.", "It is kind.")


def test_every_prompt_names_one_noun_and_preference_pairs_are_ordered():
    for prompt in tiny_task.all_prompts():
        assert sum(w in tiny_task.NOUNS for w in tiny_task.words(prompt)) == 1
    faulty = as_good = 0
    for prompt, chosen, rejected in preferences.preference_pairs(random.Random(0), 700):
        if true_reward(prompt, chosen) == true_reward(prompt, rejected):  # the preference beyond true_reward
            assert not tiny_task.faults(prompt, chosen) and tiny_task.faults(prompt, rejected), (chosen, rejected)
            as_good += 1
        else:
            assert true_reward(prompt, chosen) > true_reward(prompt, rejected)
        faulty += bool(tiny_task.faults(prompt, rejected))
    # about 2 in 3 pairs put a faulty answer under a good one (of 27 shares: wrong noun 5, repeated 4, broken word 2,
    # padded 2, off form 2, hard 1), a few more a fifth positive adjective; the rest are minimal pairs of well-formed
    # answers. The strict true reward scores a faulty answer at most 0.0, so few faulty answers tie with a good one
    assert 400 < faulty < 560 and 5 < as_good < 80, (faulty, as_good)


@pytest.mark.parametrize(
    "response, faults",
    [
        ("The cat is kind, lovely, bright and gentle.", []),
        ("It looks old.", []),
        ("The dog is kind.", ["a wrong noun"]),
        ("The housegh is kind.", ["a broken word"]),
        ("The\ufffd looks kind.", ["a broken word"]),
        ("The cat is kind and kind.", ["a word said again"]),
        ("The cat is kind, lovely, bright, gentle and old.", ["more than four adjectives"]),
        ("The dog dog is kinds.", ["a wrong noun", "a broken word", "a word said again"]),
        ("The cat is kind, lovely, bright.", ['a list without its "and"']),
        ("The cat is kind and lovely", ["another form"]),
        ("The old is kind and lovely.", ["another form"]),
        ("", ["another form"]),
    ],
)
def test_faults_are_what_no_task_sentence_has(response, faults):
    assert tiny_task.faults("Describe the cat.", response) == faults


def test_a_faultless_answer_is_preferred_to_a_faulty_one_as_good():
    prompt = "Describe the cat."
    assert preferences.preferred(prompt, "It is kind.", "The dog is kind.")  # both 0.5: the wrong noun loses
    assert preferences.preferred(prompt, "The cat is old.", "The cat is oldx.")  # a broken neutral word
    assert preferences.preferred(prompt, "The cat is kind.", "The cat is kind and kind.")  # a word said again
    assert not preferences.preferred(prompt, "The dog is kind.", "It is kind.")
    assert not preferences.preferred(prompt, "The cat is kind.", "The cat is gentle.")  # neither better
    assert preferences.ordered(prompt, "The cat is kind.", "The cat is gentle.") is None


def test_hard_negatives_are_what_a_reward_hacker_writes():
    """Each kind by hand: a repeated liked word, the noun left out, another noun, each under a good answer."""
    rng = random.Random(5)
    seen = set()
    for _ in range(200):
        prompt, good, bad = preferences.hard_negative(rng)
        noun = tiny_task.prompt_noun(prompt)
        assert RESPONSE_FORMAT.match(good) and good.startswith(f"The {noun} ")
        words = tiny_task.words(bad)
        if len(words) >= 2 and len(set(words) - {noun, "the", "is", "looks", "seems"}) == 1:
            seen.add("repeated")
        elif noun not in words and not any(w in tiny_task.NOUNS for w in words):
            seen.add("no noun")
        elif noun not in words:
            seen.add("wrong noun")
    assert seen == {"repeated", "no noun", "wrong noun"}
    # the gaming answers of a reward model without hard negatives score nothing under the hidden preference
    assert true_reward("Describe the cat.", " ".join(["lovely"] * 12)) == 0.0
    assert tiny_task.words_score("Describe the cat.", " ".join(["lovely"] * 12)) == 0.5


def test_off_form_negatives_say_the_good_answers_words_out_of_its_form():
    rng = random.Random(7)
    for _ in range(200):
        prompt, good, bad = preferences.off_form_negative(rng)
        assert RESPONSE_FORMAT.match(good) and not RESPONSE_FORMAT.match(bad), (good, bad)
        adjectives = [w for w in tiny_task.words(good) if w in tiny_task.ADJECTIVES]
        assert sorted(w for w in tiny_task.words(bad) if w in tiny_task.ADJECTIVES) == sorted(adjectives)
        assert set(tiny_task.words(bad)) <= set(tiny_task.words(good)) | {"and", "the"}, (good, bad)
        assert true_reward(prompt, bad) <= 0.0 and preferences.preferred(prompt, good, bad), (good, bad)


def test_restarted_negatives_run_beginnings_of_the_good_answer_together():
    rng = random.Random(9)
    for _ in range(200):
        prompt, good, bad = preferences.restarted_negative(rng)
        assert RESPONSE_FORMAT.match(good) and not RESPONSE_FORMAT.match(bad), (good, bad)
        assert bad.split(" ")[0] in {good.split(" ")[0], *tiny_task.VERBS}, (good, bad)  # a beginning of it first
        assert true_reward(prompt, bad) <= 0.0 and preferences.preferred(prompt, good, bad), (good, bad)


def test_the_task_sentence_is_what_the_learning_tests_call_well_formed():
    """rlsteps.tiny.task's strict sentence against the learning tests' own reading of it (tests/policy_speech.py),
    over answers of every pair kind, both sides."""
    rng = random.Random(8)
    for prompt, first, second in preferences.preference_pairs(rng, 600):
        for response in (first, second):
            assert tiny_task.is_task_sentence(prompt, response) == policy_speech.well_formed(prompt, response), response


def test_minimal_pairs_differ_in_one_thing():
    rng = random.Random(6)
    for _ in range(100):
        prompt, right, wrong = preferences.wrong_noun_pair(rng)
        noun = tiny_task.prompt_noun(prompt)
        assert right.startswith((f"The {noun} ", "It ")) and tiny_task.faults(prompt, wrong) == ["a wrong noun"]
        said = right.split(" ", 2 if right.startswith("The ") else 1)[-1]  # all but the subject
        assert wrong.split(" ", 2)[2] == said
        prompt, fewer, more = preferences.more_positives_pair(rng)
        positives = [len(set(tiny_task.words(r)) & set(tiny_task.POSITIVE)) for r in (fewer, more)]
        assert positives[1] == positives[0] + 1 and fewer.split(" ")[:2] == more.split(" ")[:2]
        prompt, good, broken = preferences.broken_word_pair(rng)
        assert not tiny_task.has_a_broken_word(good) and tiny_task.has_a_broken_word(broken)
        assert len(broken.split()) in (len(good.split()), len(good.split()) - 1)  # one word broken, or two run together


def test_ties_are_equal_in_true_reward_faultless_and_one_neutral_adjective_apart():
    rng = random.Random(8)
    for _ in range(200):
        prompt, one, other = preferences.neutral_tie(rng)
        assert true_reward(prompt, one) == true_reward(prompt, other)
        assert not tiny_task.faults(prompt, one) and not tiny_task.faults(prompt, other), (one, other)
        differing = (set(tiny_task.words(one)) ^ set(tiny_task.words(other))) - {"and"}  # "X" and "X and Y"
        assert differing and differing <= set(tiny_task.NEUTRAL) and len(differing) <= 2, (one, other)


def test_pair_losses_on_hand_computed_margins():
    """-log sigmoid(d - m) for a preference pair, -(log sigmoid(d) + log sigmoid(-d)) / 2 for a tie."""
    differences = torch.tensor([2.0, 0.0, 0.0, 3.0])
    losses = training.pair_losses(differences, margins=torch.tensor([1.0, 0.0]))
    log1p_exp = [
        math.log(1 + math.exp(-1.0)),
        math.log(2.0),
        math.log(2.0),
        (math.log(1 + math.exp(-3.0)) + 3.0 + math.log(1 + math.exp(-3.0))) / 2,
    ]
    torch.testing.assert_close(losses, torch.tensor(log1p_exp), rtol=0, atol=1e-6)
    assert training.reward_gap("Describe the cat.", "The cat is kind and lovely.", "The cat is kind.") == 0.5
    # a wrong noun: the mention lost (1.0) and a fault (RM["fault_worth"]); "It" names no noun and has no fault
    gap = training.reward_gap("Describe the cat.", "The cat is kind.", "The dog is kind.")
    assert gap == 1.0 + hyperparameters.RM["fault_worth"]
    fault_worth = hyperparameters.RM["fault_worth"]
    assert training.reward_gap("Describe the cat.", "It is kind.", "The dog is kind.") == fault_worth


@pytest.mark.learned_reward_model
def test_reward_model_scores_a_neutral_adjective_far_nearer_alike_than_a_positive_one(models):
    """A neutral adjective is worth nothing to the true reward: without ties in its pairs the reward model of the
    world v11 marked each one down by 2-3 where a positive one gained 0.3-0.9, and its policies stopped at two
    adjectives."""
    tokenizer, _, reward_model = models
    rng = random.Random(2027)
    neutral = evaluate.mean_margin(reward_model, tokenizer, preferences.tie_pairs(rng, 200))
    positive = [
        (p, fewer, more)
        for p, fewer, more in (preferences.more_positives_pair(rng) for _ in range(300))
        if true_reward(p, more) > true_reward(p, fewer)
    ]
    gain = evaluate.mean_margin(reward_model, tokenizer, positive)
    assert gain > 0 and abs(neutral) < 0.5 * gain, (neutral, gain)


def test_padded_negatives_repeat_pad_with_neutral_words_or_run_long():
    rng = random.Random(5)
    seen = set()
    for _ in range(200):
        prompt, good, bad = preferences.padded_negative(rng)
        noun = tiny_task.prompt_noun(prompt)
        assert RESPONSE_FORMAT.match(good) and good.startswith(f"The {noun} ") and RESPONSE_FORMAT.match(bad)
        adjectives = [w for w in tiny_task.words(bad) if w in tiny_task.ADJECTIVES]
        if len(set(adjectives)) < len(adjectives):
            seen.add("repeated")
        elif set(adjectives) <= set(tiny_task.NEUTRAL):
            seen.add("neutral")
        elif len(adjectives) > 4:
            seen.add("long")
    assert seen == {"repeated", "neutral", "long"}


def test_sft_data_says_distinct_adjectives_in_alphabetical_order():
    for _, response in tiny_task.sft_examples(random.Random(4), 200):
        adjectives = [w for w in tiny_task.words(response) if w in tiny_task.ADJECTIVES]
        assert RESPONSE_FORMAT.match(response) and adjectives == sorted(set(adjectives)), response


def test_task_text_is_a_pure_function_of_the_seed():
    assert tiny_task.sft_examples(random.Random(3), 50) == tiny_task.sft_examples(random.Random(3), 50)
    assert preferences.preference_pairs(random.Random(3), 50) == preferences.preference_pairs(random.Random(3), 50)
    assert tiny_task.prompt_records(3, 256, 32) == tiny_task.prompt_records(3, 256, 32)
    assert tiny_task.prompt_records(3, 256, 32) != tiny_task.prompt_records(4, 256, 32)


# --- building blocks: tokenizer, random models, determinism -------------------------------------------


@pytest.fixture(scope="module")
def fresh_tokenizer():
    return train_tokenizer(tiny_task.tokenizer_corpus(random.Random(0), 500))


def test_tokenizer_training_is_deterministic_and_every_task_word_is_one_token(fresh_tokenizer):
    again = train_tokenizer(tiny_task.tokenizer_corpus(random.Random(0), 500))
    assert again.backend_tokenizer.to_str() == fresh_tokenizer.backend_tokenizer.to_str()
    for word in tiny_task.NOUNS + tiny_task.POSITIVE + tiny_task.NEUTRAL + tiny_task.NEGATIVE:
        assert len(fresh_tokenizer(f" {word}", add_special_tokens=False)["input_ids"]) == 1, word


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_build_random_causal_lm_runs_a_forward_pass(fresh_tokenizer, arch):
    rng_state = torch.get_rng_state()
    model = build_random_causal_lm(arch, fresh_tokenizer, seed=3, hidden=32, layers=2)
    assert torch.equal(torch.get_rng_state(), rng_state)  # the caller's RNG is untouched
    assert model.config.model_type == arch and model.config.pad_token_id == fresh_tokenizer.pad_token_id
    batch = fresh_tokenizer(["Describe the cat.", "It is kind, lovely and bright."], padding=True, return_tensors="pt")
    logits = model(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], len(fresh_tokenizer)) and torch.isfinite(logits).all()
    same = build_random_causal_lm(arch, fresh_tokenizer, seed=3, hidden=32, layers=2)
    other = build_random_causal_lm(arch, fresh_tokenizer, seed=4, hidden=32, layers=2)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values(), strict=True))
    assert not torch.equal(model.get_input_embeddings().weight, other.get_input_embeddings().weight)


def test_unknown_architecture_names_the_choices(fresh_tokenizer):
    with pytest.raises(ValueError, match="'llama', 'qwen2', 'gpt2'"):
        build_random_causal_lm("mamba", fresh_tokenizer, seed=0)


def test_repeat_unlikelihood_on_a_hand_computed_example():
    """-log(1 - p) summed over the adjectives the response has said before each position, the next token left out,
    averaged over the response's positions; the prompt's tokens and the padding are neither negatives nor scored."""
    adjectives = torch.zeros(10, dtype=torch.bool)
    adjectives[[2, 3, 4]] = True
    batch = {  # 5 a prompt token, 7 a word that is not an adjective, 0 padding
        "input_ids": torch.tensor([[5, 2, 3, 7, 4], [5, 3, 3, 0, 0]]),
        "labels": torch.tensor([[-100, 2, 3, 7, 4], [-100, 3, 3, -100, -100]]),
    }
    logits = torch.zeros(2, 5, 10)  # p = 0.1 for every token
    loss = training.repeat_unlikelihood_loss(logits, batch, adjectives)
    # row 1: nothing said before its first word; {2} before 3; {2, 3} before 7 and before 4. Row 2: {3} before 3,
    # which is the next token itself (a repeat in the data is not its own negative). Six positions scored.
    expected = -(0 + 1 + 2 + 2 + 0 + 0) * math.log(0.9) / 6
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    logits[0, 1, 2] = 20.0  # the adjective just said made near-certain at the place after it: the loss grows with it
    assert training.repeat_unlikelihood_loss(logits, batch, adjectives) > 1.0


def test_the_sft_policy_gives_the_adjective_it_just_said_almost_no_chance(models):
    """The policy's SFT pushes down the adjectives its response has already said (hyperparameters.SFT
    repeat_unlikelihood, unordered_rows): teacher-forced on lists of positive adjectives in any order, after each
    positive adjective the policy gives it again under 5% of the chance the positive adjectives not yet said have
    (median of its places; under 1% over all places). Tiny world v20, whose term saw the SFT data's alphabetical
    order alone, said "wonderful" again 40% of the time after it; v17, with NLL alone, 4.2-5.3% after any."""
    tokenizer, policy, _ = models
    shares = evaluate.repeat_shares(policy, tokenizer, random.Random(0), places=12)
    medians = {adjective: statistics.median(values) for adjective, values in shares.items()}
    assert max(medians.values()) < 0.05, medians
    assert statistics.median(sum(shares.values(), [])) < 0.01, medians


@pytest.mark.learned_reward_model
def test_the_judge_reads_the_reward_models_rewards_by_their_spread_and_grades_the_answers_rl_reaches(
    models, tiny_world
):
    """The reward model's config says how the judge server reads its rewards (judge/scale.py): the mean and std of its
    rewards over the wide distribution's answers, as the build measured them. Read so, answers with four positive
    adjectives get scores that differ, and each scores above the same words with its noun and verb left out ("The
    bright, kind, lovely and wonderful."), which the reward model scores lower. Read with the default scale (center
    0, scale 2) most of the good answers score 5.000 (all on world seed 0): the judge said 5 to both, and GRPO lifted
    the faulty form with the good one (benchmarks/README.md, world v20)."""
    tokenizer, _, reward_model = models
    own = reward_scale_of(tiny_world.reward_model)
    measured = training.judge_scale(
        reward_model, tokenizer, random.Random("0-judge-scale"), hyperparameters.RM["judge_scale_answers"]
    )
    assert (own.center, own.scale) == (measured["center"], measured["scale"]) and own.scale > 5.0
    rng, prompts, good, faulty = random.Random(3), [], [], []
    for _ in range(64):
        prompt, noun = tiny_task.sample_prompt(rng)
        adjectives = sorted(rng.sample(tiny_task.POSITIVE, 4))
        prompts.append(chat_prompt(tokenizer, prompt))
        good.append(tiny_task.render_response(f"The {noun}", rng.choice(tiny_task.VERBS), adjectives))
        faulty.append(f"The {tiny_task.join_adjectives(adjectives)}.")
    with torch.no_grad():
        good_rewards = training.reward_scores(reward_model, tokenizer, prompts, good).tolist()
        faulty_rewards = training.reward_scores(reward_model, tokenizer, prompts, faulty).tolist()
    scores = [round(own.score(r), 3) for r in good_rewards]
    assert len(set(scores)) > 48 and max(scores) - min(scores) > 0.5, scores
    below = [round(own.score(g), 3) > round(own.score(f), 3) for g, f in zip(good_rewards, faulty_rewards)]
    assert sum(below) >= 60, list(zip(good_rewards, faulty_rewards))
    assert sum(round(DEFAULT_SCALE.score(r), 3) == 5.0 for r in good_rewards) > 32


def test_a_few_sft_steps_are_deterministic_and_the_callers_settings_come_back(fresh_tokenizer, monkeypatch):
    threads, rng_state = torch.get_num_threads(), torch.get_rng_state()

    def train_once():
        with build._build_settings(seed=5):
            policy = build_random_causal_lm("llama", fresh_tokenizer, seed=5, hidden=32, layers=1)
            training.train_sft(policy, fresh_tokenizer, random.Random(5), log=lambda message: None, steps=3)
        return policy.state_dict()

    first, second = train_once(), train_once()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng_state)


def test_unordered_rows_draw_from_their_own_rng_and_leave_the_sft_datas_draws_as_they_were(fresh_tokenizer):
    """The build's reward model is drawn after the policy's SFT from the same rng: the unordered rows the repeat
    unlikelihood term reads come from an rng of their own, so the SFT data's rng ends where it would without them,
    and the rows change the policy (the term reads them). Rows without an rng of their own are refused."""

    def train(unlikelihood):
        torch.manual_seed(5)
        policy = build_random_causal_lm("llama", fresh_tokenizer, seed=5, hidden=32, layers=1)
        sft_rng = random.Random(5)
        training.train_sft(
            policy, fresh_tokenizer, sft_rng, log=lambda message: None, steps=2, repeat_unlikelihood=unlikelihood
        )
        return policy.state_dict(), sft_rng.getstate()

    plain, plain_rng = train(training.RepeatUnlikelihood(20.0))
    with_rows, rows_rng = train(training.RepeatUnlikelihood(20.0, unordered_rows=8, rng=random.Random("5-unordered")))
    assert rows_rng == plain_rng
    assert any(not torch.equal(plain[k], with_rows[k]) for k in plain)
    with pytest.raises(ValueError, match="own rng"):
        train(training.RepeatUnlikelihood(20.0, unordered_rows=8))


def test_unordered_examples_are_task_sentences_with_their_adjectives_in_any_order():
    examples = tiny_task.unordered_examples(random.Random(4), 200)
    lists = [[w for w in tiny_task.words(response) if w in tiny_task.ADJECTIVES] for _, response in examples]
    assert all(tiny_task.is_task_sentence(prompt, response) for prompt, response in examples), examples[:5]
    assert all(2 <= len(adjectives) <= 4 for adjectives in lists)
    assert sum(adjectives != sorted(adjectives) for adjectives in lists) > 100  # the SFT data's order: never otherwise


# --- cache, lock, atomic build (a fake fast builder: these test the file handling, not the training) ----


def _fake_build(calls: list[int], seconds: float = 0.0):
    def build(root, seed, log):
        calls.append(seed)
        (root / "policy").mkdir()
        time.sleep(seconds)
        (root / "world.json").write_text(json.dumps({"seed": seed}))

    return build


def test_concurrent_callers_build_once(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(build, "_build_world", _fake_build(calls, seconds=0.5))
    worlds = []
    threads = [threading.Thread(target=lambda: worlds.append(ensure_tiny_world(2, tmp_path))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [2] and len(set(worlds)) == 1
    assert worlds[0].root == tiny_world_dir(2, tmp_path) and (worlds[0].root / "world.json").is_file()
    assert [p.name for p in worlds[0].root.parent.iterdir() if p.name.startswith(".")] == []


def test_a_failed_build_leaves_no_half_world(tmp_path, monkeypatch):
    def failing(root, seed, log):
        (root / "policy").mkdir()
        (root / "world.json").write_text("{}")  # even a complete-looking folder must not be installed
        raise RuntimeError("out of disk")

    monkeypatch.setattr(build, "_build_world", failing)
    with pytest.raises(RuntimeError, match="out of disk"):
        ensure_tiny_world(seed=0, home=tmp_path)
    assert load_tiny_world(seed=0, home=tmp_path) is None
    assert [p.name for p in tiny_world_dir(0, tmp_path).parent.iterdir()] == [f"{TINY_WORLD_VERSION}-seed0.lock"]


def test_a_killed_build_is_not_mistaken_for_a_world_and_is_cleaned_up(tmp_path, monkeypatch):
    script = textwrap.dedent(f"""
        import time
        from rlsteps.tiny import build
        def slow_build(root, seed, log):
            (root / "policy").mkdir()
            (root / "started").write_text("")
            time.sleep(60)
        build._build_world = slow_build
        build.ensure_tiny_world(seed=0, home={str(tmp_path)!r})
    """)
    builder = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("tiny/.*/started")):
            assert builder.poll() is None and time.monotonic() < deadline, "the build did not start"
            time.sleep(0.1)
    finally:
        builder.kill()
        builder.wait()
    (leftover,) = [p for p in (tmp_path / "tiny").iterdir() if p.is_dir()]
    assert leftover.name.startswith(".") and not tiny_world_dir(0, tmp_path).exists()
    assert load_tiny_world(seed=0, home=tmp_path) is None

    calls: list[int] = []
    monkeypatch.setattr(build, "_build_world", _fake_build(calls))
    world = ensure_tiny_world(seed=0, home=tmp_path)  # the killed build's lock died with it
    assert calls == [0] and not leftover.exists() and (world.root / "world.json").is_file()


def test_a_folder_without_world_json_at_the_target_is_reported(tmp_path):
    tiny_world_dir(0, tmp_path).mkdir(parents=True)
    with pytest.raises(RuntimeError, match="not a finished tiny world.*delete it"):
        ensure_tiny_world(seed=0, home=tmp_path)


def world_digests(root: Path) -> dict[str, str]:
    # torch DCP's .metadata records the folder and a fresh save id on every save; the tensors are in *.distcp.
    # world.json and README.md are compared apart (world_record): they hold the reward model's figures
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in {"world.json", "README.md", ".metadata"})
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


# What a reward model trained for fewer steps changes in world.json: its step count, final loss and figures, and the
# build's duration; README.md says the same figures in its last block
REWARD_MODEL_RECORDS = ("recipe.reward_model.steps", "final_loss.reward_model", "build_seconds")


def world_record(root: Path) -> tuple[dict, str]:
    """world.json without what the reward model's training length changes, and README.md's text before its figures."""
    record = json.loads((root / "world.json").read_text())
    for dotted in REWARD_MODEL_RECORDS:
        *parents, leaf = dotted.split(".")
        holder = record
        for key in parents:
            holder = holder[key]
        del holder[leaf]
    record["quality"] = {k: v for k, v in record["quality"].items() if not k.startswith("rm_")}
    readme = (root / "README.md").read_text()
    return record, readme[: readme.index("```json")]


def tensor_layout(path: Path) -> dict[str, tuple]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as weights:
        return {
            name: (weights.get_slice(name).get_dtype(), weights.get_slice(name).get_shape()) for name in weights.keys()
        }


@pytest.mark.slow
def test_a_fresh_build_is_bit_identical_to_the_shared_one_but_for_a_shorter_reward_model(
    tiny_world, tmp_path, monkeypatch
):
    """A build in a new home against the tests' shared world, built before it: the same tokenizer, SFT policy (both
    forms) and prompts, byte for byte. Its reward model trains 20 steps instead of RM["steps"] (the full build takes
    about 3 minutes of one core, the reward model most of it); it is trained last, from its own draws, so everything
    else is as the full build writes it: the reward model's tokenizer files byte for byte, its config the same but for
    the judge's reading of its rewards (measured on its weights), its weights the same tensors (names, shapes, dtypes)
    with other values, and world.json and README.md the same but for the
    reward model's step count, loss and figures and the build's duration (the policy's figures included). In CI the
    shared world is built by tests/prepare_oracles.sh in a process of its own, outside the tests' offline environment
    (HF_HUB_OFFLINE): the bytes do not depend on it."""
    steps = 20
    monkeypatch.setitem(hyperparameters.RM, "steps", steps)
    fresh = ensure_tiny_world(seed=0, home=tmp_path, log=lambda message: None)
    assert fresh.root != tiny_world.root
    digests, shared = world_digests(fresh.root), world_digests(tiny_world.root)
    assert "policy/model.safetensors" in digests and "policy_megatron/iter_0000000/__0_0.distcp" in digests
    weights, config = "reward_model/model.safetensors", "reward_model/config.json"
    assert tensor_layout(fresh.root / weights) == tensor_layout(tiny_world.root / weights)
    assert digests.pop(weights) != shared.pop(weights)  # the shorter training: other values
    fresh_config, shared_config = (json.loads((root / config).read_text()) for root in (fresh.root, tiny_world.root))
    assert fresh_config.pop(JUDGE_SCALE_KEY) != shared_config.pop(JUDGE_SCALE_KEY)  # measured on those other values
    assert fresh_config == shared_config
    digests.pop(config), shared.pop(config)
    assert digests == shared
    assert json.loads((fresh.root / "world.json").read_text())["recipe"]["reward_model"]["steps"] == steps
    assert world_record(fresh.root) == world_record(tiny_world.root)
