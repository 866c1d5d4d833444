"""The Python client: a thin, typed client of the REST API (httpx).

    from trainyard import Client
    client = Client()                      # TRAINYARD_URL/TOKEN, else `trainyard login`, else
    job = client.submit("job.yaml")        # the local stack started by `trainyard up`
    job.wait(progress=True)
    job.metrics("test/accuracy")           # [(step, value), ...]
    sweep = client.submit("sweep.yaml")    # a document with `search:`: a Sweep

Every HTTP failure becomes a typed exception; a rejected job carries the language's located
errors (`JobSpecRejected.errors`, the same `SpecIssue`s the local CLI prints). The connection
and its retries are trainyard/transport.py's, a submitted job (`Job`) trainyard/jobs.py's, a
sweep trainyard/sweeps.py's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trainyard.errors import NotFound, TrainyardError
from trainyard.jobs import Job
from trainyard.models import (
    ClusterOut,
    DatasetOut,
    JobDetail,
    JobOut,
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
from trainyard.transport import Connection
from trainyard.uploads import Progress, open_uploads, upload_file

if TYPE_CHECKING:
    import pandas as pd

    from trainyard.batch_prediction import Prediction

__all__ = ["Client", "Job"]


# -- the client ---------------------------------------------------------------------------------
class Client(Connection):
    """A connection to one Trainyard server (thread-safe for concurrent requests, like httpx):
    its jobs, sweeps, datasets, models and the account's tokens and webhooks."""

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


def _model_ref(ref: str) -> tuple[str, str | None]:
    """`model:name@which` -> (name, which or None)."""
    name, _, which = ref.removeprefix("model:").partition("@")
    if not name:
        raise TrainyardError(f"model reference {ref!r}: say name, name@3 or name@tag")
    return name, which or None


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
