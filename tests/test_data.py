import json
import subprocess
import sys

import fsspec
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from rlsteps.contract.prompts import Prompt, PromptFileError, check_prompt_file, encode_prompt_text, load_prompts
from rlsteps.engine.inputs.data import prompt_indices, steps_per_epoch

CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
WORDS = ["<pad>", "<eos>", "<bos>", "<unk>", "[", "]", "user", "system", "assistant", "a", "b", "c", "hello"]


def word_tokenizer(chat_template: str | None = CHAT_TEMPLATE, adds_bos: bool = False) -> PreTrainedTokenizerFast:
    """Whitespace words: token counts can be read off the text."""
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def write_lines(tmp_path, lines: list[str], name: str = "prompts.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


# ---------------------------------------------------------------------------------------------
# Loading


def test_loads_prompts_messages_ids_and_skips_blank_lines(tmp_path):
    path = write_lines(
        tmp_path,
        [
            json.dumps({"prompt": "a b"}),
            "",
            json.dumps({"messages": [{"role": "user", "content": "hello"}], "id": 7}),
            "   ",
            json.dumps({"prompt": "c", "id": "mine", "answer": "extra keys are ignored"}),
        ],
    )
    prompts = load_prompts(path, word_tokenizer())
    assert prompts == [
        Prompt(id="prompts:1", text="a b"),
        Prompt(id="7", text="[user] hello\n[assistant] ", messages=(("user", "hello"),)),
        Prompt(id="mine", text="c"),
    ]
    # what a judge reads: the line's own messages, or its raw text as one user message; never the rendering
    assert prompts[1].conversation == [{"role": "user", "content": "hello"}]
    assert prompts[0].conversation == [{"role": "user", "content": "a b"}]


def test_reads_fsspec_urls():
    with fsspec.open("memory://data/train.jsonl", "wt") as f:
        f.write(json.dumps({"prompt": "a"}) + "\n")
    assert load_prompts("memory://data/train.jsonl", word_tokenizer()) == [Prompt(id="train:1", text="a")]


MALFORMED = [
    ('{"prompt": "a"', "invalid JSON: Expecting ',' delimiter at column 15"),
    ('["a"]', "expected a JSON object, got list"),
    ('{"text": "a"}', 'exactly one of "prompt" or "messages", this one has neither'),
    ('{"prompt": "a", "messages": []}', "this one has both"),
    ('{"prompt": 3}', '"prompt" must be a string, got int'),
    ('{"prompt": ""}', "the prompt is empty"),
    # a chat template would render markup around it, but it says nothing: refused with or without the tokenizer
    (
        '{"messages": [{"role": "system", "content": ""}, {"role": "user", "content": " "}]}',
        "every message's content is empty",
    ),
    ('{"messages": "hi"}', '"messages" must be a non-empty list'),
    ('{"messages": []}', '"messages" must be a non-empty list'),
    ('{"messages": ["hi"]}', "messages[0] must be an object, got str"),
    ('{"messages": [{"role": "robot", "content": "a"}]}', "messages[0].role must be one of system, user, assistant"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "user"}]}', "messages[1].content must be a string"),
    ('{"prompt": "a", "id": 1.5}', '"id" must be a string or an integer, got float'),
    ('{"prompt": "a", "id": true}', '"id" must be a string or an integer, got bool'),
    ('{"prompt": "a", "id": ""}', '"id" must not be empty'),
    ('{"prompt": "a b c d"}', "the prompt has 4 tokens, more than max_prompt_tokens=3"),
]


@pytest.mark.parametrize(("bad_line", "cause"), MALFORMED)
def test_malformed_line_names_file_line_and_cause(tmp_path, bad_line, cause):
    path = write_lines(tmp_path, [json.dumps({"prompt": "a"}), "", bad_line])
    with pytest.raises(PromptFileError) as error:
        load_prompts(path, word_tokenizer(), max_prompt_tokens=3)
    message = str(error.value)
    assert message.startswith(f"{path}:3: "), message
    assert cause in message


def test_duplicate_id_names_the_first_line(tmp_path):
    path = write_lines(tmp_path, [json.dumps({"prompt": "a", "id": "x"}), json.dumps({"prompt": "b", "id": "x"})])
    with pytest.raises(PromptFileError, match=r"prompts.jsonl:2: duplicate id 'x' \(first used on line 1\)"):
        load_prompts(path, word_tokenizer())


def test_explicit_id_colliding_with_a_default_id_is_a_duplicate(tmp_path):
    path = write_lines(tmp_path, [json.dumps({"prompt": "a"}), json.dumps({"prompt": "b", "id": "prompts:1"})])
    with pytest.raises(PromptFileError, match=r":2: duplicate id 'prompts:1' \(first used on line 1\)"):
        load_prompts(path, word_tokenizer())


@pytest.mark.parametrize("lines", [[], ["", "  "]])
def test_empty_file_is_an_error(tmp_path, lines):
    path = write_lines(tmp_path, lines)
    with pytest.raises(PromptFileError, match="no prompts"):
        load_prompts(path, word_tokenizer())


def test_messages_without_a_chat_template_is_a_clear_error(tmp_path):
    path = write_lines(tmp_path, [json.dumps({"messages": [{"role": "user", "content": "a"}]})])
    with pytest.raises(PromptFileError, match=r":1: .*needs a chat template and the tokenizer has none"):
        load_prompts(path, word_tokenizer(chat_template=None))


def test_a_template_that_rejects_messages_is_reported_with_its_line(tmp_path):
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}x"
    path = write_lines(tmp_path, [json.dumps({"messages": [{"role": "assistant", "content": "a"}]})])
    with pytest.raises(PromptFileError, match=r":1: the chat template rejected these messages: .*must be user"):
        load_prompts(path, word_tokenizer(chat_template=strict))


def test_prompt_file_error_is_a_value_error():
    assert issubclass(PromptFileError, ValueError)


# ---------------------------------------------------------------------------------------------
# BOS handling


def test_no_special_tokens_for_a_tokenizer_that_adds_none():
    tokenizer = word_tokenizer()
    assert encode_prompt_text("a b", tokenizer) == [9, 10]


def test_bos_added_once_for_a_tokenizer_that_adds_one():
    tokenizer = word_tokenizer(adds_bos=True)
    assert encode_prompt_text("a b", tokenizer) == [2, 9, 10]
    assert encode_prompt_text("<bos> a b", tokenizer) == [2, 9, 10]  # a template that writes BOS gets no second one


def test_max_prompt_tokens_counts_the_bos(tmp_path):
    path = write_lines(tmp_path, [json.dumps({"prompt": "a b c"})])
    assert len(load_prompts(path, word_tokenizer(adds_bos=True), max_prompt_tokens=4)) == 1
    with pytest.raises(PromptFileError, match="the prompt has 4 tokens"):
        load_prompts(path, word_tokenizer(adds_bos=True), max_prompt_tokens=3)


# ---------------------------------------------------------------------------------------------
# Data order


def test_steps_per_epoch_drops_the_last_partial_batch():
    assert steps_per_epoch(10, 3) == 3
    assert steps_per_epoch(9, 3) == 3
    with pytest.raises(ValueError, match="cannot fill one step"):
        steps_per_epoch(2, 3)
    with pytest.raises(ValueError, match="at least 1"):
        steps_per_epoch(10, 0)


def test_one_epoch_visits_distinct_prompts_in_a_seeded_order():
    visited = []
    for step in range(3):
        indices, epoch = prompt_indices(seed=1, consumed_samples=3 * step, prompts_per_step=3, num_prompts=10)
        assert epoch == 0 and len(indices) == 3
        visited += indices
    assert len(set(visited)) == 9 and set(visited) <= set(range(10))
    assert visited != sorted(visited)  # shuffled
    other_seed = [i for s in range(3) for i in prompt_indices(2, 3 * s, 3, 10)[0]]
    assert other_seed != visited


def test_epoch_rolls_over_with_a_new_order():
    epoch0 = [i for s in range(3) for i in prompt_indices(5, 3 * s, 3, 10)[0]]
    first_of_epoch1, epoch = prompt_indices(5, 9, 3, 10)
    assert epoch == 1
    epoch1 = [i for s in range(3, 6) for i in prompt_indices(5, 3 * s, 3, 10)[0]]
    assert epoch1[:3] == first_of_epoch1
    assert epoch1 != epoch0
    assert prompt_indices(5, 18, 3, 10)[1] == 2


def test_order_is_a_pure_function_of_seed_and_consumed_samples():
    """A resumed run (fresh process state, other RNG use) continues with exactly the same prompts."""
    run = [prompt_indices(3, 4 * s, 4, 13) for s in range(12)]
    torch.manual_seed(12345)
    torch.rand(100)
    resumed = [prompt_indices(3, 4 * s, 4, 13) for s in range(7, 12)]
    assert resumed == run[7:]
    state = torch.get_rng_state()  # the global RNG is neither consulted nor advanced
    prompt_indices(3, 0, 4, 13)
    assert torch.equal(state, torch.get_rng_state())


def test_negative_consumed_samples_is_an_error():
    with pytest.raises(ValueError, match="consumed_samples"):
        prompt_indices(0, -1, 3, 10)


def test_check_prompt_file_parses_every_line_without_a_tokenizer_and_imports_no_torch(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n" + json.dumps({"prompt": "a"}))
    assert check_prompt_file(str(good)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"messages": [{"role": "robot", "content": "x"}]}))
    with pytest.raises(PromptFileError, match=r"bad.jsonl:2: messages\[0\].role must be one of"):
        check_prompt_file(str(bad))
    code = "import sys, rlsteps.contract.prompts; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_a_large_file_tells_its_progress_reading_then_measuring(tmp_path, monkeypatch):
    """A line at most every PROGRESS_S (10 s in a run; every chance here) while the file is read, then measured,
    and one at the end: 200k prompts take minutes, which must not pass in silence."""
    from rlsteps.contract import prompts as data

    monkeypatch.setattr(data, "PROGRESS_S", 0.0)
    count = 3 * data.LENGTH_BATCH
    path = write_lines(tmp_path, [json.dumps({"prompt": "a b"})] * count)
    said: list[str] = []
    assert len(load_prompts(path, word_tokenizer(), max_prompt_tokens=3, say=said.append)) == count
    assert said[0].startswith(f"prompt file {path}: read 1 lines (0% of the file), ")
    measured = [line for line in said if ": measured " in line]
    assert [line.split(": measured ")[1].split(" prompts")[0] for line in measured] == [
        f"{n * data.LENGTH_BATCH:,} of {count:,}" for n in (1, 2, 3)
    ]
    assert (
        said[-1].startswith(f"prompt file {path}: {count:,} prompts read and checked in ") and "so far" not in said[-1]
    )

    monkeypatch.setattr(data, "PROGRESS_S", 3600.0)
    said.clear()
    load_prompts(path, word_tokenizer(), max_prompt_tokens=3, say=said.append)
    assert said == []  # a file read in less than PROGRESS_S says nothing
