"""A checkpoint's model card: the job it came from and the facts of its data, in its metadata.

Every checkpoint a trainer writes carries one under `MODEL_KEY`, so that the file alone rebuilds
its net (dsl/inference.py) and the service registers it as a model without building anything
(scheduler/store/registry.py reads the card, not the tensors).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from dsl.layers.base import BuildContext
from dsl.schema import JobSpec

# The checkpoint metadata entry that holds the card.
MODEL_KEY = "model"


@dataclass(frozen=True)
class DataFacts:
    """What a model needs of its data to be built again, and what its input is."""

    sample_shape: tuple[int, ...]
    x_dtype: str  # float32 or int64 (token ids)
    num_classes: int | None
    label_shape: tuple[int, ...] = ()
    label_is_index: bool = True
    vocabulary: str | None = None  # the characters behind token ids (text)
    # What categorical columns' integer codes stood for: {"features": {...}, "label": [...]}
    categories: dict[str, Any] | None = None

    def build_context(self) -> BuildContext:
        return BuildContext(
            sample_shape=tuple(self.sample_shape),
            num_classes=self.num_classes,
            label_shape=tuple(self.label_shape),
            label_is_index=self.label_is_index,
        )


@dataclass(frozen=True)
class ModelCard:
    """A checkpoint's description of its model: the job it came from and its data's facts."""

    spec: JobSpec
    data: DataFacts

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.model_dump(mode="json", exclude_unset=True),
            "data": asdict(self.data),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelCard:
        raw = json.loads(text)
        data = dict(raw["data"])
        data["sample_shape"] = tuple(data["sample_shape"])
        data["label_shape"] = tuple(data.get("label_shape", ()))
        return cls(spec=JobSpec.model_validate(raw["spec"]), data=DataFacts(**data))


def read_model_card(path: str | Path) -> ModelCard | None:
    """The card in a checkpoint file's metadata (its header alone is read), or None where it
    has none; OSError or ValueError where the file cannot be read as a checkpoint."""
    try:
        with safe_open(str(path), framework="numpy") as handle:
            meta = dict(handle.metadata() or {})
    except SafetensorError as exc:
        raise ValueError(f"{Path(path).name} is not a safetensors checkpoint: {exc}") from None
    return ModelCard.from_json(meta[MODEL_KEY]) if MODEL_KEY in meta else None
