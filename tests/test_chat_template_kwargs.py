"""data.chat_template_kwargs: the chat template's switches as the families ship them (Qwen3's enable_thinking), passed
to apply_chat_template wherever prompts are rendered: the run's transformers tokenizer and the dry run's torch-free
renderer render the same text, and NeMo-RL gets them as policy.tokenizer.chat_template_kwargs. A key the template
never reads is said, since it changes nothing. The template here is written for these tests: like Qwen3's, with
enable_thinking false its generation prompt ends in an empty think block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlsteps.catalog import load_catalog
from rlsteps.contract.config import STEP_SCHEMAS, DataConfig
from rlsteps.contract.prompt_tokenizer import tokenizer_from_files, unread_template_kwargs
from rlsteps.contract.prompts import PromptOptions, load_prompts, prompt_lengths
from rlsteps.engine.inputs.data import load_run_prompts
from rlsteps.engine.policy.model import load_policy_tokenizer
from rlsteps.plan.compile import compile_job
from run_helpers import rlsteps
from test_data import word_tokenizer
from test_prompt_tokenizer import CONVERSATIONS

THINKING_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)
EMPTY_THINK = "<|assistant|>\n<think>\n\n</think>\n\n"
SWITCHES = [{}, {"enable_thinking": True}, {"enable_thinking": False}]


@pytest.fixture
def tokenizers(tmp_path) -> tuple:
    """(the dry run's tokenizer, the run's) of one saved tokenizer folder with the thinking template."""
    folder = tmp_path / "tokenizer"
    word_tokenizer(THINKING_TEMPLATE).save_pretrained(folder)
    ours, why = tokenizer_from_files(folder)
    assert ours is not None, why
    return ours, load_policy_tokenizer(folder)


@pytest.mark.parametrize("kwargs", SWITCHES, ids=["unset", "true", "false"])
def test_the_switch_renders_as_transformers_renders_it(kwargs, tokenizers):
    ours, theirs = tokenizers
    for conversation in CONVERSATIONS:
        expected = theirs.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False, **kwargs)
        assert ours.apply_chat_template(conversation, add_generation_prompt=True, **kwargs) == expected
        assert expected.endswith(EMPTY_THINK) == (kwargs.get("enable_thinking") is False), expected


def test_prompts_are_rendered_and_measured_with_the_kwargs_by_both_tokenizers(tokenizers, tmp_path):
    ours, theirs = tokenizers
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    options = PromptOptions(chat_template_kwargs={"enable_thinking": False})
    dry, run = (load_prompts(str(path), t, max_prompt_tokens=100, options=options) for t in (ours, theirs))
    assert [p.text for p in dry] == [p.text for p in run] and all(p.text.endswith(EMPTY_THINK) for p in run)
    texts = [p.text for p in run]
    assert prompt_lengths(texts, ours) == prompt_lengths(texts, theirs)
    plain = load_prompts(str(path), theirs)
    assert not any(p.text.endswith(EMPTY_THINK) for p in plain)


def test_the_run_reads_its_prompts_with_data_chat_template_kwargs(tokenizers, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    given = [f"inputs.prompts={path}", "inputs.policy=/sft", "inputs.reward_model=/rm", "validation.interval=0"]
    job = compile_job(
        load_catalog().find("rl/reinforce"),
        "default",
        overrides=[*given, "+data.chat_template_kwargs.enable_thinking=false"],
    )
    cfg = STEP_SCHEMAS[job.algorithm].model_validate(job.config)
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}
    said: list[str] = []
    prompts = load_run_prompts(cfg, tokenizers[1], say=said.append)
    assert all(p.text.endswith(EMPTY_THINK) for p in prompts.train) and said == []


def test_names_apply_chat_template_sets_itself_are_refused():
    with pytest.raises(ValidationError, match="data.chat_template_kwargs: add_generation_prompt cannot be set"):
        DataConfig(chat_template_kwargs={"add_generation_prompt": False})
    assert DataConfig(chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs == {
        "enable_thinking": False
    }


def test_nemo_rl_gets_them_as_its_tokenizer_config():
    from test_nemo_rl_config import RLHF_INPUTS, master

    compiled = master("rl/rlhf", *RLHF_INPUTS, "+data.chat_template_kwargs.enable_thinking=false").config
    assert compiled["policy"]["tokenizer"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert master("rl/rlhf", *RLHF_INPUTS).config["policy"]["tokenizer"]["chat_template_kwargs"] is None


def test_a_key_the_template_never_reads_is_said(tiny_world, tmp_path: Path):
    assert unread_template_kwargs(THINKING_TEMPLATE, {"enable_thinking": False, "enable_thinkng": True}) == [
        "enable_thinkng"
    ]
    done = rlsteps(
        "run", "rl/rs", "-c", "tiny", "--dry-run", "+data.chat_template_kwargs.enable_thinking=false", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert (
        "data.chat_template_kwargs: the policy's chat template never reads enable_thinking" in done.stderr + done.stdout
    )
