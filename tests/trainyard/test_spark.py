"""trainyard.spark.predict_udf in a real local Spark session (local[2]): Spark's scores of a few
thousand rows equal `trainyard predict`'s. Spark runs in a JVM: without Java the tests skip, or
fail under CI=true (scripts/ensure-apt.sh installs Debian's default-jre-headless for
`make test`)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import TrainedRun, missing_component
from trainyard.loading import ModelError, load_model, run_dir_checkpoint
from trainyard.predicting import predict_file

pytestmark = pytest.mark.slow
pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
ROWS = 3000


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    if shutil.which("java") is None:
        missing_component("no Java runtime for Spark's JVM")
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python: this one
    session = (
        SparkSession.builder.master("local[2]")
        .appName("trainyard-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    yield session
    session.stop()


def repeated(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x] * (ROWS // len(x) + 1))[:ROWS]


def test_spark_scores_equal_trainyard_predict(
    spark: Any, trained_runs: dict[str, TrainedRun], tmp_path: Path
) -> None:
    import pandas as pd

    from trainyard.spark import predict_udf

    run = trained_runs["digits_mlp"]
    x = repeated(run.x_test.reshape(len(run.x_test), -1).numpy())
    source, out = tmp_path / "x.npy", tmp_path / "scores.npy"
    np.save(source, x)
    predict_file(load_model(run_dir_checkpoint(run.run_dir)), source, out)
    columns = [f"p{i}" for i in range(x.shape[1])]
    frame = pd.DataFrame(x, columns=columns).assign(id=np.arange(ROWS))
    df = spark.createDataFrame(frame).repartition(4)
    score = predict_udf(run.run_dir, feature_columns=columns)
    scored = df.mapInPandas(score, schema=score.output_schema(df.schema)).toPandas()
    scored = scored.sort_values("id")
    assert len(scored) == ROWS
    got = np.stack(scored["scores"].to_numpy())
    np.testing.assert_allclose(got, np.load(out), atol=1e-4, rtol=0)


def test_an_array_column_and_probabilities(spark: Any, trained_runs: dict[str, TrainedRun]) -> None:
    import pandas as pd

    from trainyard.predicting import predict_array
    from trainyard.spark import predict_udf

    run = trained_runs["mnist1d_cnn"]
    x = repeated(run.x_test.numpy())
    frame = pd.DataFrame({"id": np.arange(ROWS), "signal": list(x.reshape(ROWS, -1))})
    df = spark.createDataFrame(frame)
    score = predict_udf(run.run_dir, array_column="signal", probabilities=True, checkpoint=None)
    scored = df.mapInPandas(score, schema=score.output_schema(df.schema)).toPandas()
    got = np.stack(scored.sort_values("id")["scores"].to_numpy())
    expected = predict_array(load_model(run_dir_checkpoint(run.run_dir), probabilities=True), x)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    with pytest.raises(ModelError, match=r"give feature_columns .* or array_column"):
        predict_udf(run.run_dir)
