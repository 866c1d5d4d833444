"""Scoring a Spark DataFrame with a trained model (`pip install 'trainyard[spark]'`).

    from trainyard.spark import predict_udf

    score = predict_udf("model:digits@production", feature_columns=[f"p{i}" for i in range(64)])
    scored = df.mapInPandas(score, schema=score.output_schema(df.schema))

`predict_udf` resolves the model on the driver, as `trainyard.load_model` does (a job id, a
`model:` reference, a run directory or a checkpoint file), and carries the checkpoint's bytes
to the executors with the function: a worker process loads the net from them once and keeps it
for every batch of rows after (Spark reuses its Python workers). Each batch of rows becomes a
batch of samples, from feature columns (one value each) or from one array column (a sample
each), is scored by `trainyard.predicting.predict_array` (the same scores as `trainyard predict`)
and gets a column `scores`: the sample's scores, flattened, as an array of floats.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainyard.loading import Choice, ModelError, checkpoint_file, load_checkpoint_model
from trainyard.predicting import BATCH_SIZE, predict_array

if TYPE_CHECKING:
    from dsl.inference import InferenceNet
    from trainyard.client import Client
    from trainyard.jobs import Job

# The nets a Python worker has loaded, by the digest of their checkpoint's bytes.
_LOADED: dict[tuple[str, bool], InferenceNet] = {}


class PredictUDF:
    """The function `DataFrame.mapInPandas` calls with the batches of rows of a partition."""

    def __init__(
        self,
        checkpoint: bytes,
        *,
        feature_columns: Sequence[str] | None,
        array_column: str | None,
        probabilities: bool,
        output_column: str,
        batch_size: int,
    ) -> None:
        self.checkpoint = checkpoint
        self.digest = hashlib.sha256(checkpoint).hexdigest()
        self.feature_columns = list(feature_columns) if feature_columns else None
        self.array_column = array_column
        self.probabilities = probabilities
        self.output_column = output_column
        self.batch_size = batch_size

    def model(self) -> InferenceNet:
        """The net, loaded once per worker process."""
        key = (self.digest, self.probabilities)
        if key not in _LOADED:
            import torch

            torch.set_num_threads(1)  # Spark runs a Python worker per core already
            with tempfile.TemporaryDirectory(prefix="trainyard-spark-") as folder:
                path = Path(folder) / "model.safetensors"
                path.write_bytes(self.checkpoint)
                _LOADED[key] = load_checkpoint_model(path, probabilities=self.probabilities)
        return _LOADED[key]

    def samples(self, rows: Any) -> np.ndarray:
        """One batch of rows (a pandas DataFrame) as samples."""
        if self.array_column is not None:
            return np.stack([np.asarray(v, dtype=np.float32) for v in rows[self.array_column]])
        assert self.feature_columns is not None
        return rows[self.feature_columns].to_numpy(dtype=np.float32)

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        model = self.model()
        for rows in batches:
            if len(rows) == 0:
                yield rows.assign(**{self.output_column: []})
                continue
            scores = predict_array(model, self.samples(rows), batch_size=self.batch_size)
            flat = scores.reshape(len(scores), -1)
            yield rows.assign(**{self.output_column: list(flat)})

    def output_schema(self, input_schema: Any) -> Any:
        """The scored DataFrame's schema: the input's, and the scores as an array of floats."""
        from pyspark.sql.types import ArrayType, FloatType, StructField, StructType

        field = StructField(self.output_column, ArrayType(FloatType(), False), False)
        return StructType([*input_schema.fields, field])


def predict_udf(
    model: Job | int | str | Path,
    *,
    feature_columns: Sequence[str] | None = None,
    array_column: str | None = None,
    checkpoint: Choice = None,
    probabilities: bool = False,
    output_column: str = "scores",
    batch_size: int = BATCH_SIZE,
    client: Client | None = None,
) -> PredictUDF:
    """A function for `DataFrame.mapInPandas` that scores each row with `model`: its samples
    are `feature_columns` (one number each, in the order the model's input flattens) or
    `array_column` (an array of a sample's values a row)."""
    if (feature_columns is None) == (array_column is None):
        raise ModelError("give feature_columns (a value each) or array_column (a sample each)")
    path = checkpoint_file(model, checkpoint, client=client)
    load_checkpoint_model(path)  # fails here, on the driver, for a model that cannot load
    return PredictUDF(
        path.read_bytes(),
        feature_columns=feature_columns,
        array_column=array_column,
        probabilities=probabilities,
        output_column=output_column,
        batch_size=batch_size,
    )
