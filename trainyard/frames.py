"""Metrics as pandas DataFrames: `Job.history()` and `Client.compare()` (`pip install
'trainyard[pandas]'`). Both read GET /jobs/{id}/metrics.csv, every point of the job, and
pivot it here: one row per step, a column per metric.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dsl.registry import did_you_mean
from trainyard.errors import TrainyardError

if TYPE_CHECKING:
    import pandas as pd

    from trainyard.transport import Connection


def _require_pandas() -> None:
    try:
        import pandas
    except ImportError:
        raise TrainyardError(
            "metrics as DataFrames need pandas: pip install 'trainyard[pandas]'"
        ) from None
    return pandas


def history(
    connection: Connection,
    job_id: int,
    names: Sequence[str] | None = None,
    *,
    group: int = 0,
    rank: int = 0,
) -> pd.DataFrame:
    """One row per step the job's worker (`group`, `rank`) reported at: `step`, `time` (when it
    reported the step, a UTC timestamp) and a column per metric (NaN where a metric was not
    reported at that step), in step order. `names` picks metrics; an unknown one raises."""
    _require_pandas()
    import pandas

    data = connection.request("GET", f"/jobs/{job_id}/metrics.csv").content
    points = pandas.read_csv(io.BytesIO(data), dtype={"name": str}, keep_default_na=False)
    points = points[(points["group"] == group) & (points["rank"] == rank)]
    known = sorted(set(points["name"]))
    if names is not None:
        for name in names:
            if name not in known:
                hint = did_you_mean(name, known)
                raise TrainyardError(
                    f"job {job_id} has no metric {name!r} (worker {group}/{rank})"
                    + (f"; {hint}" if hint else f"; it has {', '.join(known) or 'none yet'}")
                )
        points = points[points["name"].isin(list(names))]
    # A resumed run reports some steps again: the newest report of a step wins.
    points = points.drop_duplicates(["step", "name"], keep="last")
    wide = points.pivot(index="step", columns="name", values="value")
    wide = wide.reindex(columns=list(names) if names is not None else known)
    times = pandas.to_datetime(points.groupby("step")["time"].max(), unit="s", utc=True)
    wide.insert(0, "time", times)
    wide.columns.name = None
    return wide.reset_index().sort_values("step", ignore_index=True)


def compare(
    connection: Connection, job_ids: Sequence[int], names: Sequence[str] | None = None
) -> pd.DataFrame:
    """The histories of several jobs in one frame, with a `job` column first (the job's id);
    a metric one job lacks is NaN in its rows. `names` must be metrics of every job."""
    _require_pandas()
    import pandas

    frames = []
    for job_id in job_ids:
        frame = history(connection, job_id, names)
        frame.insert(0, "job", job_id)
        frames.append(frame)
    if not frames:
        raise TrainyardError("compare needs at least one job id")
    return pandas.concat(frames, ignore_index=True)
