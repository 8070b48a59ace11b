"""The base of every config section and the number types the schemas share. Torch-free."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0)]
PositiveFloat = Annotated[float, Field(gt=0.0)]


class Section(BaseModel):
    """A config section: unknown keys refused (a typo is an error, not a default), frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)
