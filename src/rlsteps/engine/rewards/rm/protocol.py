"""The reward-model server's request and answer: POST /v1/rewards takes prompts, conversations or token ids."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, PositiveInt, model_validator


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # a template may read more than role and content
    role: str
    content: str


class RewardsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts: list[str] | None = None  # rendered as the policy saw them
    conversations: list[list[Message]] | None = None  # rendered with the reward model's chat template
    responses: list[str] | None = None
    tokens: list[list[int]] | None = None
    max_length: PositiveInt | None = None  # tokens kept per pair; the server's --max-length when absent
    truncation_side: Literal["left", "right"] | None = None  # the server's --truncation-side when absent

    @model_validator(mode="after")
    def one_kind_of_input(self) -> RewardsRequest:
        given = [name for name in ("prompts", "conversations", "tokens") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError('give either "prompts" or "conversations" (each with "responses"), or "tokens"')
        if self.tokens is not None:
            if self.responses is not None:
                raise ValueError('"responses" go with "prompts" or "conversations", not with "tokens"')
            if any(len(row) == 0 for row in self.tokens):
                raise ValueError('"tokens" has an empty row: every row needs at least one token id')
            return self
        if self.responses is None:
            raise ValueError(f'"{given[0]}" and "responses" must be given together')
        inputs = self.prompts if self.prompts is not None else self.conversations
        if len(inputs) != len(self.responses):
            raise ValueError(
                f'"{given[0]}" and "responses" have different lengths ({len(inputs)} vs {len(self.responses)})'
            )
        return self

    def __len__(self) -> int:
        inputs = next(x for x in (self.tokens, self.prompts, self.conversations, []) if x is not None)
        return len(inputs)


class RewardsResponse(BaseModel):
    rewards: list[float]
