"""The Python client: a thin, typed client of the REST API (httpx).

    from trainyard import Client
    client = Client()                      # TRAINYARD_URL/TOKEN, else `trainyard login`, else
    job = client.submit("job.yaml")        # the local stack started by `trainyard up`
    job.wait(progress=True)
    job.metrics("test/accuracy")           # [(step, value), ...]
    sweep = client.submit("sweep.yaml")    # a document with `search:`: a Sweep

Every HTTP failure becomes a typed exception; a rejected job carries the language's located
errors (`JobSpecRejected.errors`, the same `SpecIssue`s the local CLI prints).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml
from httpx_retries import Retry, RetryTransport

from contract.settings import Settings
from trainyard.connection import resolve_connection
from trainyard.errors import NotFound, TrainyardError, Unreachable, WaitTimeout, raise_for_response
from trainyard.models import (
    CheckpointOut,
    ClusterOut,
    DatasetOut,
    EventOut,
    JobDetail,
    JobEnvironmentOut,
    JobOut,
    LogLineOut,
    ModelVersionOut,
    PredictionOut,
    SweepDetail,
    SweepOut,
    TokenCreated,
    TokenOut,
    UploadOut,
    WebhookCreated,
    WebhookOut,
)
from trainyard.sweeps import Sweep
from trainyard.uploads import Progress, open_uploads, upload_file

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from httpx_sse import ServerSentEvent

    from dsl.inference import InferenceNet
    from trainyard.batch_prediction import Prediction

API_PREFIX = "/api/v1"
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


# Idempotent requests (GET, PUT, DELETE, ...) are retried on 429, 502, 503, 504 and on
# connection errors, waiting what Retry-After says (at most MAX_RETRY_WAIT), else backing off
# exponentially; a submission (POST) is never sent twice.
RETRIES = 5
MAX_RETRY_WAIT = 60.0


def retrying_transport(retries: int) -> RetryTransport:
    """httpx-retries' transport: Retry-After honoured, jittered exponential back-off."""
    return RetryTransport(
        retry=Retry(total=retries, backoff_factor=0.5, max_backoff_wait=MAX_RETRY_WAIT)
    )


# -- the client ---------------------------------------------------------------------------------
class Client:
    """A connection to one Trainyard server (thread-safe for concurrent requests, like httpx)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = RETRIES,
        settings: Settings | None = None,
    ) -> None:
        if url is None or token is None:
            found = resolve_connection(settings or Settings())
            url = url or found.url
            token = token or found.token
        if not url:
            raise TrainyardError(
                "no server address: pass url=, set TRAINYARD_URL, run `trainyard login URL`, "
                "or start a local stack with `trainyard up`"
            )
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=self.url + API_PREFIX,
            headers=headers,
            timeout=timeout,
            transport=retrying_transport(retries),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(
                f"cannot reach {self.url} ({exc.__class__.__name__}: {exc}); is the server "
                "running (`trainyard up`)?"
            ) from None
        raise_for_response(response)
        return response

    def get_json(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, params=clean).json()

    # -- jobs ------------------------------------------------------------------------------------
    def submit(
        self,
        job: str | Path | Mapping[str, Any],
        overrides: Mapping[str, Any] | None = None,
        priority: int = 0,
    ) -> Job | Sweep:
        """Submit a job: a YAML file path, YAML text, or an already-parsed mapping. A document
        with a `search:` section is a sweep, and its Sweep is returned."""
        document = _job_document(job)
        body = {"spec": document, "overrides": dict(overrides or {}), "priority": priority}
        if _is_sweep(document):
            data = self.request("POST", "/sweeps", json=body).json()
            return Sweep(self, SweepDetail.model_validate(data))
        data = self.request("POST", "/jobs", json=body).json()
        return Job(self, JobDetail.model_validate(data))

    def validate(
        self, job: str | Path | Mapping[str, Any], overrides: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Dry run: the layer table, parameter count, topology and placement preview."""
        body = {"spec": _job_document(job), "overrides": dict(overrides or {})}
        result: dict[str, Any] = self.request("POST", "/jobs/validate", json=body).json()
        return result

    def job(self, job_id: int) -> Job:
        return Job(self, JobDetail.model_validate(self.get_json(f"/jobs/{job_id}")))

    # -- webhooks --------------------------------------------------------------------------------
    def webhooks(self) -> list[WebhookOut]:
        """Your webhooks, each with its last delivery's status."""
        return [WebhookOut.model_validate(h) for h in self.get_json("/webhooks")]

    def add_webhook(self, url: str, events: list[str]) -> WebhookCreated:
        """Register a URL for events among job.finished, job.failed and sweep.finished; the
        answer's `secret` (shown this once) verifies deliveries (contract.webhooks.verify)."""
        data = self.request("POST", "/webhooks", json={"url": url, "events": events}).json()
        return WebhookCreated.model_validate(data)

    def remove_webhook(self, webhook_id: int) -> None:
        self.request("DELETE", f"/webhooks/{webhook_id}")

    def jobs(
        self,
        state: str | Iterable[str] | None = None,
        name: str | None = None,
        page_size: int = 50,
    ) -> Iterator[Job]:
        """Every visible job (in one of the `state`s, when given), newest first, fetched page
        by page as the caller iterates."""
        states = [state] if isinstance(state, str) else list(state or [])
        cursor: str | None = None
        while True:
            page = self.get_json(
                "/jobs",
                state=[s.upper() for s in states] or None,
                name=name,
                limit=page_size,
                cursor=cursor,
            )
            for item in page["items"]:
                yield Job(self, JobOut.model_validate(item))
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def sweep(self, sweep_id: int) -> Sweep:
        return Sweep(self, SweepDetail.model_validate(self.get_json(f"/sweeps/{sweep_id}")))

    def sweeps(self, page_size: int = 50) -> Iterator[Sweep]:
        """Every visible sweep, newest first, fetched page by page as the caller iterates."""
        before: int | None = None
        while True:
            page = self.get_json("/sweeps", limit=page_size, before=before)
            for item in page["items"]:
                yield Sweep(self, SweepOut.model_validate(item))
            before = page.get("next_before")
            if not before:
                return

    def compare(self, job_ids: Sequence[int], names: Sequence[str] | None = None) -> pd.DataFrame:
        """Several jobs' metric histories in one pandas DataFrame with a `job` column (see
        Job.history; needs `pip install 'trainyard[pandas]'`)."""
        from trainyard.frames import compare

        return compare(self, job_ids, names)

    # -- your API tokens -------------------------------------------------------------------------
    def tokens(self) -> list[TokenOut]:
        """Your API tokens (never their secrets), oldest first."""
        return [TokenOut.model_validate(t) for t in self.get_json("/tokens")]

    def create_token(self, name: str, expires_in_days: int | None = None) -> TokenCreated:
        """A new token of yours; its secret (`.token`) is in this answer only."""
        body: dict[str, Any] = {"name": name}
        if expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        return TokenCreated.model_validate(self.request("POST", "/tokens", json=body).json())

    def revoke_token(self, token_id: int) -> None:
        """Revoke a token of yours (and every token it minted), at once."""
        self.request("DELETE", f"/tokens/{token_id}")

    # -- cluster and datasets --------------------------------------------------------------------
    def cluster(self) -> ClusterOut:
        return ClusterOut.model_validate(self.get_json("/cluster"))

    def upload_dataset(
        self,
        path: str | Path,
        name: str,
        *,
        part_size: int | None = None,
        label_column: str | None = None,
        restart: bool = False,
        progress: Progress | None = None,
    ) -> DatasetOut:
        """Upload a file in parts, resuming an interrupted upload of it (trainyard/uploads.py):
        .npz, .csv (text columns become indices, `label_column` the label), .parquet, UTF-8
        .txt for the text source, or a .tar of npy shards. Jobs then use
        `data: {source: dataset, name: NAME}` (`{source: text, dataset: NAME}` for a text;
        `{source: shards, dataset: NAME}` streams a .tar's, a .parquet's or a text-column
        .csv's shards). `progress(sent, total)` follows it."""
        return upload_file(
            self,
            Path(path),
            name,
            part_size=part_size,
            label_column=label_column,
            restart=restart,
            progress=progress,
        )

    def uploads(self) -> list[UploadOut]:
        """Your uploads not completed: what `upload_dataset` would resume."""
        return open_uploads(self)

    def abort_upload(self, upload_id: str) -> None:
        self.request("DELETE", f"/datasets/uploads/{upload_id}")

    def datasets(self) -> list[DatasetOut]:
        return [DatasetOut.model_validate(d) for d in self.get_json("/datasets")]

    def delete_dataset(self, name: str) -> None:
        """Delete your dataset (a Conflict while a queued or running job reads it)."""
        self.request("DELETE", f"/datasets/{name}")

    # -- the model registry ----------------------------------------------------------------------
    def register_model(
        self, name: str, job: Job | int, checkpoint: str | int | None = None
    ) -> ModelVersionOut:
        """A new version (name@1, @2, ...) of your model `name`: the checkpoint of one of your
        jobs (best, latest or a step; default the best where it kept one, else the latest)."""
        body: dict[str, Any] = {"name": name, "job_id": job.id if isinstance(job, Job) else job}
        if checkpoint is not None:
            body["checkpoint"] = str(checkpoint)
        return ModelVersionOut.model_validate(self.request("POST", "/models", json=body).json())

    def models(self) -> list[ModelVersionOut]:
        """Every version of your models, by name, then version."""
        return [ModelVersionOut.model_validate(m) for m in self.get_json("/models")]

    def model(self, ref: str) -> ModelVersionOut:
        """One version: `name@3`, `name@production` (the version a tag is on) or `name` (the
        newest); a `model:` prefix is allowed."""
        name, which = _model_ref(ref)
        if which is None:
            mine = [m for m in self.models() if m.name == name]
            if not mine:
                raise NotFound(f"you have no model {name}", 404)
            return mine[-1]
        return ModelVersionOut.model_validate(self.get_json(f"/models/{name}/{which}"))

    def tag_model(self, name: str, version: int, tag: str) -> ModelVersionOut:
        """Put `tag` on name@version (taking it off the version of `name` that had it)."""
        data = self.request("POST", f"/models/{name}/{version}/tags", json={"tag": tag}).json()
        return ModelVersionOut.model_validate(data)

    def untag_model(self, name: str, version: int, tag: str) -> ModelVersionOut:
        data = self.request("DELETE", f"/models/{name}/{version}/tags/{tag}").json()
        return ModelVersionOut.model_validate(data)

    def delete_model(self, name: str, version: int) -> None:
        self.request("DELETE", f"/models/{name}/{version}")

    def download_model(self, ref: str, directory: str | Path) -> Path:
        """A model version's checkpoint, saved as <dir>/<name>-v<version>.safetensors."""
        found = self.model(ref)
        target = Path(directory).expanduser() / f"{found.name}-v{found.version}.safetensors"
        url = f"/models/{found.name}/{found.version}/checkpoint"
        return self.download(url, target)

    def predict_dataset(
        self,
        job_or_model: int | str,
        dataset: str,
        *,
        workers: int = 1,
        checkpoint: str | int | None = None,
        probabilities: bool = False,
        batch_size: int = 1024,
    ) -> Prediction:
        """Score your uploaded `dataset` on the cluster with a job's checkpoint (its id) or a
        registered model (`model:name@3`), `workers` processes each scoring a shard; returns
        the run (Prediction: wait, download, scores)."""
        from trainyard import batch_prediction

        path = batch_prediction.source_path(self, job_or_model)
        return batch_prediction.start(
            self,
            path,
            dataset=dataset,
            workers=workers,
            checkpoint=checkpoint,
            probabilities=probabilities,
            batch_size=batch_size,
        )

    def prediction(self, prediction_id: int) -> Prediction:
        from trainyard.batch_prediction import Prediction

        data = self.get_json(f"/predictions/{prediction_id}")
        return Prediction(self, PredictionOut.model_validate(data))

    def export_model(
        self, ref: str, path: str | Path, format: str = "onnx", *, probabilities: bool = False
    ) -> Path:
        """A model version exported by the server (as Job.export)."""
        found = self.model(ref)
        url = f"/models/{found.name}/{found.version}/export"
        params = {"format": format, "probabilities": probabilities}
        return self.download(url, Path(path).expanduser(), params=params, metadata=True)

    def download(
        self,
        url: str,
        target: Path,
        *,
        params: dict[str, Any] | None = None,
        metadata: bool = False,
    ) -> Path:
        """GET `url` streamed into `target` (whole or not at all); with `metadata`, the
        answer's X-Trainyard-Model header also into `<target>.json`."""
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        try:
            with self.http.stream("GET", url, params=params, timeout=None) as response:
                if not response.is_success:
                    response.read()
                    raise_for_response(response)
                header = response.headers.get("x-trainyard-model", "{}")
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise Unreachable(f"cannot reach {self.url} ({exc})") from None
        partial.replace(target)
        if metadata:
            text = json.dumps(json.loads(header), indent=2, sort_keys=True) + "\n"
            target.with_name(target.name + ".json").write_text(text)
        return target


def _model_ref(ref: str) -> tuple[str, str | None]:
    """`model:name@which` -> (name, which or None)."""
    name, _, which = ref.removeprefix("model:").partition("@")
    if not name:
        raise TrainyardError(f"model reference {ref!r}: say name, name@3 or name@tag")
    return name, which or None


def _value(raw: float | None) -> float:
    """The API sends NaN and infinities as null."""
    return math.nan if raw is None else float(raw)


def _job_document(job: str | Path | Mapping[str, Any]) -> str | dict[str, Any]:
    if isinstance(job, Mapping):
        return dict(job)
    if isinstance(job, Path):
        return job.read_text()
    # A one-line string ending in .yaml/.yml is a file name; anything else is YAML text.
    if "\n" not in job and job.strip().endswith((".yaml", ".yml")):
        path = Path(job.strip()).expanduser()
        if not path.exists():
            raise TrainyardError(f"no such job file: {path}")
        return path.read_text()
    return job


def _is_sweep(document: str | dict[str, Any]) -> bool:
    """Whether the document has a `search:` section (a malformed one is the server's to
    locate, as a job)."""
    if isinstance(document, str):
        try:
            document = yaml.safe_load(document)
        except yaml.YAMLError:
            return False
    return isinstance(document, dict) and "search" in document


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

        return history(self, names, group=group, rank=rank)

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
        target_dir = Path(directory).expanduser()
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / f"step-{step:08d}.safetensors"
        partial = target.with_suffix(".part")
        try:
            with self.client.http.stream("GET", f"/jobs/{self.id}/checkpoints/{step}") as response:
                if not response.is_success:
                    response.read()
                    raise_for_response(response)
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise Unreachable(f"cannot reach {self.client.url} ({exc})") from None
        partial.replace(target)
        return target

    # -- the trained model ------------------------------------------------------------------------
    def load_model(
        self, checkpoint: str | int | None = None, *, probabilities: bool = False
    ) -> InferenceNet:
        """The job's net for prediction (trainyard.load_model): its `best` checkpoint where one
        was kept, else its `latest`, or the one of a step; downloaded once."""
        from trainyard.loading import load_model

        key = (checkpoint, probabilities)
        if key not in self._models:
            self._models[key] = load_model(self, checkpoint, probabilities=probabilities)
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
