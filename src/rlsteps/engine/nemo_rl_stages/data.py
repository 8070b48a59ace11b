"""prompt_jsonl rows written as the rows NeMo-RL's datasets read, each file written whole or not at all.

rl/rlhf (NeMo-Gym's NemoGymDataset): the conversation as the Responses API input, and the NeMo-Gym agent that
serves the row; the prompt's id as `prompt_id`, which genrm_compare groups a prompt's rollouts by.
rl/reinforce (NeMo-RL's ResponseDataset through math_hf_data_processor, which reads the first message as the
prompt): `{"input": text, "output": ""}`, so a prompt of several messages cannot be expressed and is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fsspec

from rlsteps.contract.algorithms import nemo_rl_form
from rlsteps.contract.prompts import GYM_ROW_KEY, Prompt, PromptFileError, load_prompts


def gym_row(prompt: Prompt, agent: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": prompt.conversation},
        "agent_ref": {"type": "responses_api_agents", "name": agent},
        "prompt_id": prompt.id,
    }


def response_row(prompt: Prompt) -> dict[str, Any]:
    conversation = prompt.conversation
    if len(conversation) != 1 or conversation[0]["role"] != "user":
        raise ValueError(
            f"prompt {prompt.id!r} has {len(conversation)} messages: rl/reinforce on NeMo-RL takes single-turn "
            'prompts (one user message, or a "prompt" string)'
        )
    return {"input": conversation[0]["content"], "output": ""}


def _records(prompts_file: str) -> list[dict[str, Any]]:
    """The file's JSON objects in order, blank lines skipped (as load_prompts, which has checked them, reads it)."""
    with fsspec.open(prompts_file, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_rows(prompts_file: str, target: Path, algorithm: str, agent: str) -> int:
    """The prompt file's rows for NeMo-RL at target; the number of rows. PromptFileError names the file and line."""
    prompts = load_prompts(prompts_file, tokenizer=None)
    records = _records(prompts_file)
    judged = nemo_rl_form(algorithm).judge  # rewards from NeMo-Gym's judge: its rows
    rows = []
    for number, (prompt, record) in enumerate(zip(prompts, records, strict=True), start=1):
        try:
            if not judged:
                rows.append(response_row(prompt))
            elif GYM_ROW_KEY in record:  # already a NeMo-Gym row: kept whole (a principle, the agent it names)
                rows.append({"agent_ref": gym_row(prompt, agent)["agent_ref"], **record, "prompt_id": prompt.id})
            else:
                rows.append(gym_row(prompt, agent))
        except ValueError as error:
            raise PromptFileError(f"{prompts_file}: prompt {number}: {error}") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(partial, target)
    return len(rows)
