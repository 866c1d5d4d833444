"""Prediction runs in the store: the task their workers are handed, read from the run's own
row, and migration 0022, which moved the old runs (jobs of framework "predict") there; on
SQLite and PostgreSQL."""

from __future__ import annotations

import json

from sqlalchemy import inspect, text

from dsl.run_kinds import PREDICTION, TRAINING
from scheduler.store.database import Database
from scheduler.store.models import Job, Prediction, utcnow
from scheduler.store.predictions import prediction_task

OLD_TASK = {
    "checkpoint": "/art/jobs/1/checkpoints/step-40.safetensors",
    "dataset": "/art/datasets/1/many.npz",
    "kind": "npz",
    "key": "x",
    "rows": 10,
    "probabilities": True,
    "batch_size": 256,
}


def test_prediction_runs_stored_before_run_kinds_become_runs_of_kind_prediction(
    sql_url: str,
) -> None:
    """Migration 0022 on a store with a training job and a prediction run of the old form (a
    job of framework "predict", its largest shard's rows in train_steps, "predict/rows" its
    objective, its task in its topology): the run is of kind prediction, its task in its own
    row, no framework, train_steps or objective; the training job is of kind training. The
    downgrade writes the old form back."""
    from alembic import command

    from scheduler.store.database import alembic_config, make_engine

    config = alembic_config(sql_url)
    command.upgrade(config, "0021_job_graphs")
    engine = make_engine(sql_url)
    now = utcnow()
    placed = {"framework": "predict", "nworker_groups": 1, "nworkers_per_group": 3, "workers": 3}
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO users (id, name, is_admin, created_at) VALUES (1, 'old', false, :t)"),
            {"t": now},
        )
        for job_id, framework, topology, train_steps, objective in (
            (1, "local", {"framework": "local"}, 40, "test/accuracy"),
            (2, "predict", {**placed, "predict": OLD_TASK}, 4, "predict/rows"),
        ):
            conn.execute(
                text(
                    "INSERT INTO jobs (id, owner_id, name, state, priority, spec_yaml, overrides, "
                    "spec, topology, framework, train_steps, step, summary, best_metric, "
                    "best_step, cancel_requested, created_at, objective, objective_mode, "
                    "attempt, restarts) VALUES (:id, 1, 'old', 'SUCCEEDED', 0, '', '{}', '{}', "
                    ":topology, :framework, :steps, :steps, '{}', 4.0, :steps, false, :t, "
                    ":objective, 'max', 0, 0)"
                ),
                {
                    "id": job_id,
                    "topology": json.dumps(topology),
                    "framework": framework,
                    "steps": train_steps,
                    "objective": objective,
                    "t": now,
                },
            )
        conn.execute(
            text(
                "INSERT INTO predictions (id, owner_id, job_id, run_job_id, dataset, rows, step, "
                "workers, probabilities, created_at) VALUES (1, 1, 1, 2, 'many', 10, 40, 3, true, "
                ":t)"
            ),
            {"t": now},
        )
    engine.dispose()
    command.upgrade(config, "head")
    database = Database(sql_url)
    with database.session() as session:
        trained, run = session.get_one(Job, 1), session.get_one(Job, 2)
        assert (trained.kind, trained.framework, trained.train_steps) == (
            TRAINING.name,
            "local",
            40,
        )
        assert trained.objective == "test/accuracy" and trained.best_metric == 4.0
        assert (run.kind, run.framework, run.train_steps, run.objective) == (
            PREDICTION.name,
            "",
            0,
            "",
        )
        assert (run.best_metric, run.best_step) == (None, None)
        assert run.topology == {**placed, "framework": ""}
        task = prediction_task(session, 2)
        assert (task.checkpoint, task.dataset, task.format, task.key) == (
            OLD_TASK["checkpoint"],
            OLD_TASK["dataset"],
            "npz",
            "x",
        )
        assert (task.rows, task.probabilities, task.batch_size) == (10, True, 256)
        assert session.get_one(Prediction, 1).dataset == "many"
    database.dispose()

    command.downgrade(config, "0021_job_graphs")
    engine = make_engine(sql_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, framework, train_steps, objective, topology FROM jobs ORDER BY id")
        ).all()
        columns = {c["name"] for c in inspect(conn).get_columns("predictions")}
    engine.dispose()
    trained_back, run_back = rows
    assert tuple(trained_back[1:4]) == ("local", 40, "test/accuracy")
    assert tuple(run_back[1:4]) == ("predict", 4, "predict/rows")
    stored = run_back[4]
    assert (stored if isinstance(stored, dict) else json.loads(stored)) == {
        **placed,
        "predict": OLD_TASK,
    }
    assert "checkpoint" not in columns
