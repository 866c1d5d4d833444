"""The model registry: a user's named models, each a list of versions (name@1, name@2, ...).

A version is a job's checkpoint (best, latest or a step), kept in
`<artifacts>/models/<owner>/<name>-v<version>.safetensors` (a hard link where the file system
allows, else a copy), so it outlives its job; with it the job's objective and its value at that
step, its execution spec, the facts of its data (the checkpoint's model card) and its summary.
A tag (`production`) is on one version of a name at a time. Users see their own models alone:
another user's answer as absent.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from contract.rundir import model_dir
from dsl.data_config import DATASET_NAME_PATTERN
from dsl.model_card import read_model_card
from scheduler.store.errors import Conflict, InvalidRequest, NotFound
from scheduler.store.jobs import own_job
from scheduler.store.models import Metric, ModelVersion, User
from scheduler.store.reports import model_checkpoint

NAME_PATTERN = DATASET_NAME_PATTERN
TAG_PATTERN = r"^[A-Za-z][A-Za-z0-9_.\-]{0,49}$"  # a letter first: never read as a version
MAX_VERSIONS = 500  # versions one user may keep, all names together
MAX_TAGS = 20  # tags on one version


def parse_ref(ref: str) -> tuple[str, int | str | None]:
    """`name`, `name@3` or `name@production` (a `model:` prefix allowed): the name, and the
    version, the tag or None (the newest version)."""
    text = ref.removeprefix("model:")
    name, _, which = text.partition("@")
    check_name(name)
    if not which:
        return name, None
    if which.isdigit():
        return name, int(which)
    check_tag(which)
    return name, which


def check_name(name: str) -> None:
    if not re.fullmatch(NAME_PATTERN, name):
        raise InvalidRequest(
            f"model name {name!r} is not allowed: use 1-100 letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )


def check_tag(tag: str) -> None:
    if not re.fullmatch(TAG_PATTERN, tag):
        raise InvalidRequest(
            f"tag {tag!r} is not allowed: use 1-50 letters, digits, '_', '.', '-', starting "
            "with a letter"
        )


def register_model(
    session: Session,
    owner: User,
    *,
    name: str,
    job_id: int,
    checkpoint: int | str | None,
    artifacts: Path,
) -> ModelVersion:
    """A new version of the owner's model `name`, committed: the checkpoint of their job
    `job_id` that `checkpoint` names (best, latest, a step; default the best where kept, else
    the latest)."""
    check_name(name)
    job = own_job(session, owner.id, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    step, source = model_checkpoint(session, job.id, checkpoint, artifacts=artifacts)
    try:
        card = read_model_card(source)
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"job {job.id}'s checkpoint at step {step}: {exc}") from None
    if card is None:
        raise InvalidRequest(
            f"job {job.id}'s checkpoint at step {step} has no model card (it was written "
            "before checkpoints described their model); train the job again"
        )
    kept = session.scalar(select(func.count()).where(ModelVersion.owner_id == owner.id)) or 0
    if kept >= MAX_VERSIONS:
        raise Conflict(
            f"you keep {kept} model versions, the most the service keeps for one user; "
            "delete some (trainyard models delete)"
        )
    newest = session.scalar(
        select(func.max(ModelVersion.version)).where(
            ModelVersion.owner_id == owner.id, ModelVersion.name == name
        )
    )
    version = (newest or 0) + 1
    target = model_dir(artifacts, owner.id) / f"{name}-v{version}.safetensors"
    _keep_copy(source, target)
    row = ModelVersion(
        owner_id=owner.id,
        name=name,
        version=version,
        job_id=job.id,
        job_name=job.name,
        step=step,
        path=str(target),
        size=target.stat().st_size,
        objective=job.objective,
        objective_mode=job.objective_mode,
        objective_value=_value_at(session, job.id, job.objective, step),
        metrics=dict(job.summary or {}),
        spec=card.spec.model_dump(mode="json", exclude_unset=True),
        data=card.to_dict()["data"],
        tags=[],
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        target.unlink(missing_ok=True)
        raise Conflict(f"{name}@{version} was registered at the same time; try again") from None
    return row


def _keep_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    partial.unlink(missing_ok=True)
    try:
        os.link(source, partial)  # the same bytes, no more disk
    except OSError:
        shutil.copyfile(source, partial)
    os.replace(partial, target)


def _value_at(session: Session, job_id: int, metric: str, step: int) -> float | None:
    """The objective's value that group 0, rank 0 reported at `step` (None if it did not)."""
    return session.scalar(
        select(Metric.value).where(
            Metric.job_id == job_id,
            Metric.name == metric,
            Metric.step == step,
            Metric.group == 0,
            Metric.rank == 0,
        )
    )


def list_models(session: Session, owner: User) -> list[ModelVersion]:
    """Every version of the owner's models, by name, then version."""
    query = select(ModelVersion).where(ModelVersion.owner_id == owner.id)
    return list(session.scalars(query.order_by(ModelVersion.name, ModelVersion.version)))


def get_model(session: Session, owner: User, name: str, which: int | str | None) -> ModelVersion:
    """The owner's version of `name`: a version number, the one a tag is on, or the newest."""
    query = select(ModelVersion).where(ModelVersion.owner_id == owner.id, ModelVersion.name == name)
    versions = list(session.scalars(query.order_by(ModelVersion.version)))
    if isinstance(which, int):
        versions = [v for v in versions if v.version == which]
    elif isinstance(which, str):
        versions = [v for v in versions if which in (v.tags or [])]
    if not versions:
        shown = name if which is None else f"{name}@{which}"
        raise NotFound(f"you have no model {shown}")
    return versions[-1]


def model_file(row: ModelVersion) -> Path:
    path = Path(row.path)
    if not path.is_file():
        raise NotFound(f"the file of model {row.name}@{row.version} is gone ({path.name})")
    return path


def tag_model(session: Session, owner: User, name: str, version: int, tag: str) -> ModelVersion:
    """Put `tag` on `name@version`, taking it off the version of `name` that had it."""
    check_tag(tag)
    row = get_model(session, owner, name, version)
    for other in list_models(session, owner):
        if other.name == name and tag in (other.tags or []) and other.id != row.id:
            other.tags = [t for t in other.tags if t != tag]
    if tag not in (row.tags or []):
        if len(row.tags or []) >= MAX_TAGS:
            raise Conflict(f"{name}@{version} has {MAX_TAGS} tags, the most a version may have")
        row.tags = [*(row.tags or []), tag]
    session.commit()
    return row


def untag_model(session: Session, owner: User, name: str, version: int, tag: str) -> ModelVersion:
    row = get_model(session, owner, name, version)
    if tag not in (row.tags or []):
        raise NotFound(f"{name}@{version} has no tag {tag!r}")
    row.tags = [t for t in row.tags if t != tag]
    session.commit()
    return row


def delete_model(session: Session, owner: User, name: str, version: int) -> None:
    """Delete `name@version` and its file."""
    row = get_model(session, owner, name, version)
    path = Path(row.path)
    session.delete(row)
    session.commit()
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
