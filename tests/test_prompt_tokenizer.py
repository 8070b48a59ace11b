"""The tokenizer a dry run measures prompts with, read from the policy's files without torch or transformers, against
transformers' own: the same rendered chat text and the same lengths, for the tiny world's policy and for tokenizers
that add a BOS and templates that use the special tokens, raise_exception, the {% generation %} tag and loop
controls. A prompt the run would refuse is refused by the dry run, at the same line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlsteps.contract.prompt_tokenizer import tokenizer_from_files
from rlsteps.contract.prompts import PromptFileError, load_prompts, prompt_lengths
from rlsteps.engine.policy.model import load_policy_tokenizer
from rlsteps.tiny.layout import load_tiny_world
from test_data import word_tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "hello a b"}],
    [{"role": "system", "content": "c"}, {"role": "user", "content": "a"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b b"}, {"role": "user", "content": "c"}],
]
TEMPLATES = {
    "roles": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}",
    "special tokens, loop controls, tojson": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% continue %}{% endif %}{{ m['role'] }} {{ m['content'] | tojson }} {{ eos_token }}\n{% endfor %}",
    "blocks on lines of their own (trim_blocks, lstrip_blocks)": "{% for m in messages %}\n    {% if m['role'] %}\n"
    "{{ m['role'] }}: {{ m['content'] }}\n    {% endif %}\n{% endfor %}\n"
    "{% if add_generation_prompt %}\nassistant:\n{% endif %}",
    "generation tag and a namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}{% else %}"
    "{{ m['content'] }}{% endif %}\n{% endfor %}{{ ns.n }}",
}


def saved_word_tokenizer(folder: Path, template: str, adds_bos: bool) -> Path:
    word_tokenizer(template, adds_bos=adds_bos).save_pretrained(folder)
    return folder


def assert_measured_alike(folder: Path, prompts: list[str]) -> None:
    ours, why = tokenizer_from_files(folder)
    assert ours is not None, why
    theirs = load_policy_tokenizer(folder)  # what the run measures with (transformers' AutoTokenizer)
    for conversation in CONVERSATIONS:
        expected = theirs.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        assert ours.apply_chat_template(conversation, add_generation_prompt=True) == expected
        prompts = [*prompts, expected]
    assert prompt_lengths(prompts, ours) == prompt_lengths(prompts, theirs)
    assert ours.bos_token_id == theirs.bos_token_id


@pytest.mark.parametrize("adds_bos", [False, True])
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_a_saved_tokenizer_measures_as_transformers_does(name, adds_bos, tmp_path):
    folder = saved_word_tokenizer(tmp_path / "tokenizer", TEMPLATES[name], adds_bos)
    assert_measured_alike(folder, ["a b c", "<bos> a b", "hello"])


def test_the_tiny_policy_measures_as_transformers_does(request):
    world = load_tiny_world(0) or request.getfixturevalue("tiny_world")
    assert_measured_alike(Path(world.policy), ["Describe the tree.", "", "  two  spaces", "éàü unicode"])
    assert_measured_alike(Path(world.policy_megatron), ["Describe the tree."])  # its tokenizer/ folder


def test_a_template_that_raises_refuses_the_line_as_the_run_would(tmp_path):
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}x"
    folder = saved_word_tokenizer(tmp_path / "tokenizer", strict, adds_bos=False)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "a"}) + "\n" + json.dumps({"messages": [{"role": "assistant", "content": "a"}]}) + "\n"
    )
    ours, _ = tokenizer_from_files(folder)
    for tokenizer in (ours, load_policy_tokenizer(folder)):
        with pytest.raises(PromptFileError, match=r"prompts.jsonl:2: the chat template rejected .*must be user"):
            load_prompts(str(prompts), tokenizer, max_prompt_tokens=10)


def test_a_folder_without_tokenizer_json_says_why(tmp_path):
    assert tokenizer_from_files(tmp_path) == (None, f"{tmp_path} has no tokenizer.json")


def test_a_core_install_without_the_tokenizers_package_is_told_the_extra_to_install(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers raises ImportError, as without it
    assert tokenizer_from_files(tmp_path) == (
        None,
        "the tokenizers package is not installed here (pip install 'rlsteps[engine]')",
    )
