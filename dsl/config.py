"""The strict pydantic base every job-language model derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys are errors, never silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=True)
