"""The checkpoint a job starts from (`checkpoint.init_from: {job: ID}` or `{model: name@3}`),
found among its owner's jobs and models and checked against the job's net."""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError, safe_open
from sqlalchemy.orm import Session

from dsl.compiler import CompiledJob
from dsl.errors import JobSpecError
from dsl.schema import InitFrom
from scheduler.store.artifacts import UnsafePath
from scheduler.store.errors import NotFound, StoreError
from scheduler.store.jobs import own_job
from scheduler.store.models import User
from scheduler.store.registry import get_model, model_file, parse_ref
from scheduler.store.reports import model_checkpoint


def starting_checkpoint(
    session: Session, owner: User, compiled: CompiledJob, artifacts: Path
) -> Path:
    """The checkpoint file `init_from: {job: ID}` or `{model: name@3}` names, the owner's own
    (another user's job or model is as absent), whose parameters of the net's names have the
    net's shapes (and at least one does); else a JobSpecError located at checkpoint.init_from."""
    init = compiled.spec.checkpoint.init_from
    assert isinstance(init, InitFrom)
    source, where = compiled.source, ("checkpoint", "init_from")
    try:
        if init.model is not None:
            what = f"model {init.model}"
            name, which = parse_ref(init.model)
            path = model_file(get_model(session, owner, name, which))
        else:
            assert init.job is not None  # one of the two, as the schema checks
            job = own_job(session, owner.id, init.job)
            if job is None:
                raise JobSpecError(
                    source.issue(
                        (*where, "job"),
                        f"you have no job {init.job}",
                        "trainyard jobs lists yours",
                    )
                )
            choice = init.checkpoint
            step, path = model_checkpoint(
                session,
                job.id,
                int(choice) if choice and choice.isdigit() else choice,
                artifacts=artifacts,
            )
            what = f"job {job.id}'s checkpoint at step {step}"
        with safe_open(str(path), framework="numpy") as handle:
            saved = {
                key.removeprefix("param/"): list(handle.get_slice(key).get_shape())
                for key in handle.keys()  # noqa: SIM118  (a safetensors handle, not a dict)
                if key.startswith("param/")
            }
    except NotFound as exc:
        if init.model is None:
            raise JobSpecError(source.issue(where, str(exc))) from None
        hint = "trainyard models list shows yours"
        raise JobSpecError(source.issue((*where, "model"), str(exc), hint)) from None
    except (StoreError, UnsafePath) as exc:
        raise JobSpecError(source.issue(where, str(exc))) from None
    except (OSError, SafetensorError) as exc:
        raise JobSpecError(source.issue(where, f"{what} cannot be read: {exc}")) from None
    net = {name: list(p.shape) for name, p in compiled.net.named_params().items()}
    wrong = [
        f"{name} (the checkpoint's {saved[name]}, this net's {shape})"
        for name, shape in net.items()
        if name in saved and saved[name] != shape
    ]
    if wrong:
        raise JobSpecError(
            source.issue(
                where,
                f"{len(wrong)} parameter(s) of {what} have other shapes than this net's: "
                f"{', '.join(wrong)}",
                "rename the layers that differ, so that they start from their initialisers",
            )
        )
    if not saved.keys() & net.keys():
        raise JobSpecError(
            source.issue(
                where,
                f"no parameter of {what} has a name of this net's "
                f"(it has {', '.join(sorted(saved)[:8])})",
                "layers are matched by name: <layer>/<param>",
            )
        )
    return path
