"""A submitted job as the Python client sees it (`Client.submit`, `Client.job`, `Client.jobs`
return these): its state, its metrics and logs, its checkpoints and exports, and its trained
model (loaded on this machine, or scoring a dataset on the cluster).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.errors import NotFound, WaitTimeout
from trainyard.model_files import Choice, load_checkpoint_model, model_cache, parse_choice
from trainyard.models import (
    CheckpointOut,
    EventOut,
    JobDetail,
    JobEnvironmentOut,
    JobOut,
    LogLineOut,
    PredictionOut,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from httpx_sse import ServerSentEvent

    from dsl.inference import InferenceNet
    from trainyard.batch_prediction import Prediction
    from trainyard.client import Client

MAX_POINTS = 100_000  # the most points per series the server returns in one answer
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "PRUNED"})
# What the progress bar shows next to the step counter (see trainyard.console.format_stats).
PROGRESS_METRICS = (
    "train/loss",
    "train/accuracy",
    "train/recon_error",
    "test/accuracy",
    "samples_per_sec",
)


def _value(raw: float | None) -> float:
    """The API sends NaN and infinities as null."""
    return math.nan if raw is None else float(raw)


class Job:
    """A submitted job; `info` is its last fetched state (call `refresh()` for a newer one): a
    JobOut as listed, a JobDetail (with the submitted document) when fetched by id."""

    def __init__(self, client: Client, info: JobOut) -> None:
        self.client = client
        self.info = info
        self._models: dict[tuple[str | int | None, bool], InferenceNet] = {}

    def __repr__(self) -> str:
        return f"Job(id={self.id}, name={self.name!r}, state={self.state}, step={self.step})"

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def step(self) -> int:
        return self.info.step

    @property
    def summary(self) -> dict[str, Any]:
        return self.info.summary

    @property
    def error(self) -> str | None:
        return self.info.error

    @property
    def done(self) -> bool:
        return self.info.state in TERMINAL_STATES

    @property
    def warnings(self) -> list[str]:
        """What its submission was warned of (a JobDetail's; a listed job has none)."""
        return self.info.warnings if isinstance(self.info, JobDetail) else []

    def refresh(self) -> Job:
        self.info = JobDetail.model_validate(self.client.get_json(f"/jobs/{self.id}"))
        return self

    def cancel(self) -> Job:
        data = self.client.request("POST", f"/jobs/{self.id}/cancel").json()
        self.info = JobDetail.model_validate(data)
        return self

    def delete(self) -> None:
        self.client.request("DELETE", f"/jobs/{self.id}")

    def wait(self, progress: bool = False, timeout: float | None = None, poll: float = 1.0) -> Job:
        """Block until the job ends (SUCCEEDED, FAILED, CANCELLED, PRUNED); return it refreshed."""
        if progress:
            from trainyard.progress import follow_with_progress

            return follow_with_progress(self, timeout=timeout, poll=poll)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done:
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {self.id} is still {self.state} after {timeout}s")
            time.sleep(poll)
        return self

    def latest_metrics(self, names: tuple[str, ...] = PROGRESS_METRICS) -> dict[str, float]:
        """The newest value of each named metric (rank 0 of group 0 when several report)."""
        # Every series near the step, the wanted kept here: asking by name would be refused
        # for a name an ended job never reported (one the progress bar shows when there).
        data = self.client.get_json(
            f"/jobs/{self.id}/metrics", start_step=max(self.step - 1, 0), max_points=10
        )
        out: dict[str, float] = {}
        for series in data["series"]:
            if series["name"] not in names:
                continue
            if series["points"] and series.get("group", 0) == 0 and series.get("rank", 0) == 0:
                out[series["name"]] = _value(series["points"][-1][1])
        return out

    def metrics(
        self,
        name: str,
        *,
        start_step: int | None = None,
        end_step: int | None = None,
        max_points: int = MAX_POINTS,
        group: int = 0,
        rank: int = 0,
    ) -> list[tuple[int, float]]:
        """The points of one metric series as (step, value); every point up to `max_points`,
        beyond that evenly spaced buckets of steps, each keeping its last point. A name the job
        never reported raises NotFound with a did-you-mean once it has succeeded; while it runs
        (or after it failed) such a name has no points yet."""
        data = self.client.get_json(
            f"/jobs/{self.id}/metrics",
            name=name,
            start_step=start_step,
            end_step=end_step,
            max_points=max_points,
            group=group,
        )
        for series in data["series"]:
            if series["name"] == name and series.get("rank", 0) == rank:
                return [(int(step), _value(value)) for step, value in series["points"]]
        return []

    def history(
        self, names: Sequence[str] | None = None, *, group: int = 0, rank: int = 0
    ) -> pd.DataFrame:
        """Every metric of the job as a pandas DataFrame: one row per step, with `step`, `time`
        (UTC) and a column per metric (`pip install 'trainyard[pandas]'`)."""
        from trainyard.frames import history

        return history(self.client, self.id, names, group=group, rank=rank)

    def download_tensorboard(self, directory: str | Path) -> Path:
        """The job's TensorBoard event files, extracted into `directory`/job-<id>/ (run
        `tensorboard --logdir DIRECTORY`); returns that folder."""
        import tarfile
        import tempfile

        target = Path(directory).expanduser()
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target) as scratch:
            tar = self.client.download(f"/jobs/{self.id}/tensorboard", Path(scratch) / "tb.tar")
            with tarfile.open(tar) as archive:
                archive.extractall(target, filter="data")  # no member leaves `target`
        return target / f"job-{self.id}"

    def metric_names(self) -> list[str]:
        names: list[str] = self.client.get_json(f"/jobs/{self.id}/metrics/names")["names"]
        return names

    def log_lines(self, after: int | None = None, limit: int = 500) -> tuple[list[LogLineOut], int]:
        """One page of log lines after the line id `after`; returns (lines, next cursor)."""
        data = self.client.get_json(f"/jobs/{self.id}/logs", after=after, limit=limit)
        lines = [LogLineOut.model_validate(line) for line in data["lines"]]
        cursor = data.get("next")
        return lines, int(cursor) if cursor is not None else (after or 0)

    def logs(self) -> list[str]:
        """Every log line of the job so far."""
        out: list[str] = []
        after: int | None = None
        while True:
            lines, after = self.log_lines(after)
            out.extend(line.line for line in lines)
            if not lines:
                return out

    def stream(self, last_event_id: str | None = None) -> Iterator[ServerSentEvent]:
        """The job's live events (state, metric, log, checkpoint, event, ... end) as they
        come, reconnecting after a dropped connection (trainyard/streaming.py)."""
        from trainyard.streaming import stream_events

        return stream_events(self.client, self.id, last_event_id=last_event_id)

    def follow_logs(
        self, *, tail: int | None = None, grep: re.Pattern[str] | str | None = None
    ) -> Iterator[LogLineOut]:
        """Every log line so far (the last `tail`), then each new one as the job prints it,
        until it ends; with `grep`, only the lines that match it."""
        from trainyard.streaming import follow_log_lines

        return follow_log_lines(self.client, self.id, tail=tail, grep=grep)

    def events(self) -> list[EventOut]:
        return [EventOut.model_validate(e) for e in self.client.get_json(f"/jobs/{self.id}/events")]

    def environment(self) -> JobEnvironmentOut:
        """What each of its worker processes trained with (empty until one has started)."""
        data = self.client.get_json(f"/jobs/{self.id}/environment")
        return JobEnvironmentOut.model_validate(data)

    def packages(self, group: int = 0, rank: int = 0) -> list[str]:
        """The packages installed where a worker process ran, as name==version lines."""
        path = f"/jobs/{self.id}/environment/packages"
        text = self.client.request("GET", path, params={"group": group, "rank": rank}).text
        return text.splitlines()

    def checkpoints(self) -> list[CheckpointOut]:
        data = self.client.get_json(f"/jobs/{self.id}/checkpoints")
        return [CheckpointOut.model_validate(c) for c in data]

    def export(
        self,
        path: str | Path,
        format: str = "onnx",
        checkpoint: str | int | None = None,
        *,
        probabilities: bool = False,
    ) -> Path:
        """The job's net exported by the server (`onnx` or `torch-export`) to `path`, with its
        metadata (input name, shape and dtype; a text job's vocabulary) in `<path>.json`."""
        params: dict[str, Any] = {"format": format, "probabilities": probabilities}
        if checkpoint is not None:
            params["checkpoint"] = str(checkpoint)
        target = Path(path).expanduser()
        return self.client.download(f"/jobs/{self.id}/export", target, params=params, metadata=True)

    def download_checkpoint(
        self, directory: str | Path, step: int | None = None, *, best: bool = False
    ) -> Path:
        """Save a checkpoint as <dir>/step-NNNNNNNN.safetensors: the one of `step`, the one of
        the objective's best step with `best` (checkpoint.keep_best), or else the newest."""
        if best:
            marked = [c.step for c in self.checkpoints() if c.best]
            if not marked:
                raise NotFound(
                    f"job {self.id} has no best checkpoint (yet): it keeps one with "
                    "checkpoint.keep_best: true",
                    404,
                )
            step = marked[-1]
        elif step is None:
            known = self.checkpoints()
            if not known:
                raise NotFound(f"job {self.id} has no checkpoints yet", 404)
            step = max(c.step for c in known)
        target = Path(directory).expanduser() / f"step-{step:08d}.safetensors"
        return self.client.download(f"/jobs/{self.id}/checkpoints/{step}", target)

    # -- the trained model ------------------------------------------------------------------------
    def load_model(
        self, checkpoint: str | int | None = None, *, probabilities: bool = False
    ) -> InferenceNet:
        """The job's net for prediction (trainyard.load_model): its `best` checkpoint where one
        was kept, else its `latest`, or the one of a step; downloaded once."""
        key = (checkpoint, probabilities)
        if key not in self._models:
            path = download_model_checkpoint(self, parse_choice(checkpoint))
            self._models[key] = load_checkpoint_model(path, probabilities=probabilities)
        return self._models[key]

    def predict_dataset(
        self,
        dataset: str,
        *,
        workers: int = 1,
        checkpoint: str | int | None = None,
        probabilities: bool = False,
        batch_size: int = 1024,
    ) -> Prediction:
        """Score your uploaded `dataset` on the cluster with this job's model (Client.predict_
        dataset)."""
        return self.client.predict_dataset(
            self.id,
            dataset,
            workers=workers,
            checkpoint=checkpoint,
            probabilities=probabilities,
            batch_size=batch_size,
        )

    def predictions(self) -> list[Prediction]:
        """Your prediction runs of this job, newest first."""
        from trainyard.batch_prediction import Prediction

        data = self.client.get_json(f"/jobs/{self.id}/predictions")
        return [Prediction(self.client, PredictionOut.model_validate(p)) for p in data]

    def predict(
        self, x: Any, checkpoint: str | int | None = None, *, probabilities: bool = False
    ) -> np.ndarray:
        """The scores of the samples `x` (an array or tensor (N, *sample_shape)) that fed the
        job's loss layer, or their softmax with `probabilities`, as a float32 array."""
        from trainyard.predicting import predict_array

        return predict_array(self.load_model(checkpoint, probabilities=probabilities), x)


def job_checkpoint_step(job: Job, choice: Choice = None) -> int:
    """The step of the job's checkpoint that `choice` names, from the server's list."""
    known = job.checkpoints()
    if not known:
        raise NotFound(f"job {job.id} has no checkpoints (yet)", 404)
    steps = sorted(c.step for c in known)
    if isinstance(choice, int):
        if choice not in steps:
            listed = ", ".join(str(s) for s in steps)
            raise NotFound(
                f"job {job.id} has no checkpoint at step {choice} (it has {listed})", 404
            )
        return choice
    best = [c.step for c in known if c.best]
    if choice == "best" and not best:
        raise NotFound(
            f"job {job.id} has no best checkpoint: a job keeps one with checkpoint.keep_best: true",
            404,
        )
    if choice != "latest" and best:
        return best[-1]
    return steps[-1]


def download_model_checkpoint(job: Job, choice: Choice = None) -> Path:
    """The job's checkpoint that `choice` names, downloaded once into the client's cache."""
    step = job_checkpoint_step(job, choice)
    cache = model_cache(job.client.url) / f"job-{job.id}"
    cached = cache / f"step-{step:08d}.safetensors"
    if cached.is_file():
        return cached
    return job.download_checkpoint(cache, step)
