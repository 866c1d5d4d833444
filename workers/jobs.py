"""From a job document to a compiled net and its data: what every runner does first."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsl.compiler import CompiledJob, build_net, load_spec
from dsl.errors import JobSpecError
from dsl.layers.base import BuildContext
from dsl.schema import JobSpec
from dsl.source import SourceMap
from workers.data import DataInfo, Dataset, DataSourceError, load_dataset


def build_context(info: DataInfo) -> BuildContext:
    return BuildContext(
        sample_shape=tuple(info.sample_shape),
        num_classes=info.num_classes,
        label_shape=tuple(info.label_shape),
        label_is_index=info.label_is_index,
    )


def prepare_job(
    document: str | Mapping[str, Any],
    *,
    cache_dir: Path,
    base_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    filename: str = "<job>",
) -> tuple[CompiledJob, Dataset]:
    """Validate the job, load its data, infer shapes and build the net."""
    spec, source = load_spec(document, overrides=overrides, filename=filename)
    try:
        dataset = load_dataset(
            spec.data, seed=spec.seed, cache_dir=cache_dir, base_dir=base_dir or Path.cwd()
        )
    except DataSourceError as exc:
        path = ("data", exc.field) if exc.field else ("data", "source")
        raise JobSpecError(source.issue(path, str(exc.message), exc.hint)) from None
    train_size = len(dataset.x_train)
    if spec.data.batch_size > train_size:
        # Caught here rather than when the first batch is drawn, so `validate` reports it too.
        raise JobSpecError(
            source.issue(
                ("data", "batch_size"),
                f"batch_size {spec.data.batch_size} is larger than the {train_size} training "
                "samples",
                f"use at most {train_size}",
            )
        )
    return compile_for_info(spec, source, dataset.info), dataset


def compile_for_info(spec: JobSpec, source: SourceMap, info: DataInfo) -> CompiledJob:
    """Infer shapes and build the net from the data's description alone (no samples loaded):
    what the API does to check a job at submission."""
    net, table = build_net(spec, source, build_context(info))
    return CompiledJob(spec, net, table, source)
