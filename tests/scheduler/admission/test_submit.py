"""The submission pipeline (scheduler/admission/submit.py) called directly, as the API's routes and
the sweep thread call it: on both SQL backends, with the session's real Redis (the rate limit's
count, the announcements) and real Optuna storage for the sweep thread's trials."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contract.announcements import JOB, SWEEP
from contract.keys import Keys
from contract.settings import Settings
from dsl.errors import JobSpecError
from dsl.source import read_document
from scheduler.admission.checks import Kind, kind_of
from scheduler.admission.policy import NotAllowed
from scheduler.admission.quotas import QuotaExceeded
from scheduler.admission.rate_limit import RateLimited
from scheduler.admission.submit import (
    Backends,
    Submission,
    check,
    queue_job,
    submit_job,
    submit_sweep,
    trial_submission,
    validate,
)
from scheduler.admission.sweep_checks import check_sweep
from scheduler.daemon.sweep_thread import SweepRunner
from scheduler.store.database import Database
from scheduler.store.models import Job, Sweep, User
from scheduler.store.quotas import set_quotas
from scheduler.store.states import JobState, SweepState
from scheduler.store.sweeps import create_sweep
from scheduler.store.users import create_user, get_user
from scheduler.sweeps.study import close_storages

ROOT = Path(__file__).resolve().parents[3]
JOB_YAML = (ROOT / "examples" / "digits_mlp.yaml").read_text().replace("2000", "100")
SEARCH = """
search:
  metric: test/accuracy
  mode: max
  algorithm: random
  max_trials: 2
  max_parallel: 2
  seed: 3
  space:
    updater.lr.base: {loguniform: [0.01, 0.3]}
"""
SWEEP_YAML = JOB_YAML + SEARCH


@dataclass
class Env:
    db: Database
    client: redis.Redis
    backends: Backends

    def session(self) -> Any:
        return self.db.session()

    def count(self, model: type[Job] | type[Sweep]) -> int:
        with self.session() as session:
            return session.scalar(select(func.count()).select_from(model)) or 0


@pytest.fixture
def env(
    db: Database, migrated_sql_url: str, redis_url: str, tmp_path: Path, cache_dir: Path
) -> Iterator[Env]:
    settings = Settings(
        data_dir=tmp_path,
        database_url=migrated_sql_url,
        redis_url=redis_url,
        redis_prefix=f"t{uuid.uuid4().hex[:8]}",
    )
    (tmp_path / "cache").symlink_to(cache_dir)  # digits: described once per session
    client = redis.Redis.from_url(redis_url)
    with db.session() as session:
        create_user(session, "ann")
        create_user(session, "root", is_admin=True)
    yield Env(db, client, Backends(settings, client, Keys(settings.redis_prefix)))
    close_storages()
    client.close()


def user(session: Session, name: str = "ann") -> User:
    found = get_user(session, name)
    assert found is not None
    return found


def text(document: str, **fields: Any) -> Submission:
    return Submission(document=document, spec_yaml=document, **fields)


class Announcements:
    """A subscriber to the announcements channel, subscribed before anything is submitted."""

    def __init__(self, env: Env) -> None:
        self.pubsub = env.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(env.backends.keys.announcements)
        deadline = time.monotonic() + 10
        channel = env.backends.keys.announcements
        while not env.client.pubsub_numsub(channel)[0][1]:
            assert time.monotonic() < deadline, "never subscribed"
            time.sleep(0.01)

    def received(self, seconds: float = 2.0) -> list[str]:
        out, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.1)
            if message is not None:
                out.append(message["data"].decode())
        return out


def test_the_kind_is_read_from_the_parsed_document(env: Env) -> None:
    def kind(document: str | dict[str, Any], **overrides: Any) -> Kind:
        return kind_of(read_document(document), overrides)

    assert kind(JOB_YAML) == Kind.JOB and kind(SWEEP_YAML) == Kind.SWEEP
    assert kind({"name": "j", "search": None}) == Kind.JOB
    assert kind({"name": "j", "search": {"metric": "x"}}) == Kind.SWEEP
    # Overrides decide as they would once applied, without applying them.
    assert kind(SWEEP_YAML, search=None) == Kind.JOB
    assert kind(JOB_YAML, **{"search.metric": "test/accuracy"}) == Kind.SWEEP
    with pytest.raises(JobSpecError) as refused:
        kind_of(read_document(SWEEP_YAML), expect=Kind.JOB)
    [issue] = refused.value.issues
    assert issue.path == "search" and "POST /api/v1/sweeps" in (issue.hint or "")
    assert issue.line == SWEEP_YAML.splitlines().index("search:") + 1
    with pytest.raises(JobSpecError, match="malformed YAML"):
        read_document("name: [unclosed")


def test_a_sweep_is_told_from_a_job_before_anything_is_compiled(env: Env) -> None:
    # Neither document compiles: each is refused for its kind, not for its net.
    broken_sweep = SWEEP_YAML.replace("srclayers: [fc3]}", "srclayers: [nothing]}")
    broken_job = JOB_YAML.replace("srclayers: [fc3]}", "srclayers: [nothing]}")
    with env.session() as session:
        with pytest.raises(JobSpecError) as as_job:
            submit_job(session, user(session), text(broken_sweep), env.backends)
        with pytest.raises(JobSpecError) as as_sweep:
            submit_sweep(session, user(session), text(broken_job), env.backends)
        with pytest.raises(JobSpecError) as compiled:
            validate(session, user(session), text(broken_sweep), env.backends)
    assert [i.path for i in as_job.value.issues] == ["search"]
    assert "no search section" in str(as_sweep.value)
    assert "nothing" in str(compiled.value)  # the dry run compiles it, and says why it fails
    assert (env.count(Job), env.count(Sweep)) == (0, 0)


def test_a_submitted_job_is_queued_previewed_committed_and_announced(env: Env) -> None:
    heard = Announcements(env)
    with env.session() as session:
        job = submit_job(session, user(session), text(JOB_YAML, priority=-2), env.backends)
        job_id = job.id
    with env.session() as session:
        stored = session.get_one(Job, job_id)  # committed: another session sees it
        assert (stored.state, stored.priority, stored.train_steps) == (JobState.QUEUED, -2, 100)
        assert stored.pending_reason is not None
        assert stored.pending_reason.startswith("no node agent is alive")  # the preview
        assert stored.sweep_id is None and stored.spec_yaml == JOB_YAML
        sweep = submit_sweep(session, user(session), text(SWEEP_YAML), env.backends)
        sweep_id = sweep.id
    assert heard.received() == [f"{JOB} {job_id}", f"{SWEEP} {sweep_id}"]
    with env.session() as session, pytest.raises(JobSpecError):
        submit_job(session, user(session), text("name: [unclosed"), env.backends)
    assert heard.received(0.5) == []  # a refused submission announces nothing


def test_priority_rate_and_quotas_hold_user_submissions(env: Env) -> None:
    with env.session() as session:
        with pytest.raises(NotAllowed, match="only admins may set a priority above"):
            submit_job(session, user(session), text(JOB_YAML, priority=5), env.backends)
        admins = submit_job(
            session, user(session, "root"), text(JOB_YAML, priority=5), env.backends
        )
        assert admins.priority == 5
        set_quotas(session, user(session), {"train_steps": 50, "submissions_per_minute": 3})
        session.commit()
        with pytest.raises(QuotaExceeded, match="train_steps 100 is over your quota"):
            submit_job(session, user(session), text(JOB_YAML), env.backends)
        # A sweep's base job is held to the quotas as a job is.
        with pytest.raises(QuotaExceeded, match="train_steps 100 is over your quota"):
            submit_sweep(session, user(session), text(SWEEP_YAML), env.backends)
        # The rate counts refused submissions too: it is taken before anything is compiled.
        small = JOB_YAML.replace("train_steps: 100", "train_steps: 50")
        submit_job(session, user(session), text(small), env.backends)
        with pytest.raises(RateLimited) as limited:
            submit_job(session, user(session), text(small), env.backends)
    assert "submissions_per_minute is 3" in str(limited.value)
    assert 1 <= limited.value.retry_after <= 60
    assert env.count(Job) == 2  # the admin's and the one that fitted


def test_a_dry_run_is_checked_but_neither_admitted_nor_written(env: Env) -> None:
    with env.session() as session:
        set_quotas(session, user(session), {"train_steps": 50, "submissions_per_minute": 1})
        session.commit()
        for _ in range(3):  # past the rate and the quota, with a priority of admins
            found = validate(session, user(session), text(SWEEP_YAML, priority=5), env.backends)
    assert found.job.spec.name == "digits-mlp" and found.job.spec.search is not None
    assert not found.preview.feasible and found.preview.assignments == []
    assert (env.count(Job), env.count(Sweep)) == (0, 0)


def test_trials_go_through_the_submission_checks_but_not_the_users_rate_or_quotas(
    env: Env,
) -> None:
    with env.session() as session:
        sweep = submit_sweep(session, user(session), text(SWEEP_YAML, priority=-3), env.backends)
        sweep_id = sweep.id
        # The sweep was admitted when submitted: its trials are not held to what follows.
        set_quotas(session, user(session), {"train_steps": 50, "submissions_per_minute": 1})
        session.commit()
    settings, client, keys = env.backends.settings, env.client, env.backends.keys
    assert SweepRunner(env.db, settings, client, keys).run_once() == 2
    with env.session() as session:
        trials = list(session.scalars(select(Job).where(Job.sweep_id == sweep_id)))
    assert sorted(job.name for job in trials) == ["digits-mlp-trial0", "digits-mlp-trial1"]
    for job in trials:
        assert (job.priority, job.state) == (-3, JobState.QUEUED)
        assert set(job.overrides) == {"updater.lr.base"}
        assert job.spec["updater"]["lr"]["base"] == job.overrides["updater.lr.base"]
        assert job.pending_reason is None  # the scheduler's pass says why a trial waits


def test_a_trial_is_checked_with_the_service_rules_for_its_sweeps_owner(env: Env) -> None:
    with env.session() as session:
        ann = user(session)
        checked = check_sweep(
            SWEEP_YAML,
            session=session,
            owner=ann,
            cache_dir=env.backends.settings.cache_dir(),
            base_dir=ROOT,
            artifacts=env.backends.settings.artifacts(),
        )
        new = checked.to_new_sweep(spec_yaml=SWEEP_YAML, overrides={}, base_dir=ROOT)
        # A base job that only an admin may run, stored without the submission's checks.
        server_file = {"source": "npz", "path": "x.npz", "batch_size": 64}
        base_job = {**new.base_job, "data": server_file}
        sweep = create_sweep(session, ann, dataclasses.replace(new, base_job=base_job))
        submission = trial_submission(
            sweep, 0, {"updater.lr.base": 0.1}, extra={}, settings=env.backends.settings
        )
        with pytest.raises(JobSpecError, match="reads a server file"):
            check(session, ann, submission, env.backends, expect=Kind.JOB, admit=False)
        sweep_id = sweep.id
    settings, client, keys = env.backends.settings, env.client, env.backends.keys
    SweepRunner(env.db, settings, client, keys).run_once()
    with env.session() as session:
        failed = session.get_one(Sweep, sweep_id)
        assert failed.state == SweepState.FAILED and "reads a server file" in (failed.error or "")
    assert env.count(Job) == 0


def test_a_trial_shows_its_params_and_applies_extra_overrides(env: Env) -> None:
    with env.session() as session:
        ann = user(session)
        sweep = submit_sweep(session, ann, text(SWEEP_YAML), env.backends)
        submission = trial_submission(
            sweep,
            7,
            {"updater.lr.base": 0.1},
            extra={"train_steps": 40},
            settings=env.backends.settings,
        )
        checked = check(session, ann, submission, env.backends, expect=Kind.JOB, admit=False)
        job = queue_job(session, ann, checked)
        assert (job.name, job.sweep_id, job.trial_number) == ("digits-mlp-trial7", sweep.id, 7)
        assert job.overrides == {"updater.lr.base": 0.1} and job.train_steps == 40
        assert "search" not in job.spec
