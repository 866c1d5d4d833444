"""Shared fixtures. Torch runs one intra-op thread per process (2 threads on 2 cores is slower).

Two test processes. `make test` runs the suite in two pytest-xdist workers
(`-n 2 --dist loadfile --no-loadscope-reorder`): most of its time is spent waiting on
subprocesses (stacks, clusters, bench scripts), so a second worker fills the cores the first
leaves idle. The conventions that keep that safe:

- A test file runs whole on one worker (FileGroupScheduling below): its module-scoped fixtures
  (a stack, a cluster) start once, as in a serial run. Session-scoped ones (`redis_url`,
  `postgres_url`, `stack`, `trained_runs`) are per worker, so they never share state between
  workers: PostgreSQL databases and Redis key prefixes are named per session or per test,
  ports are free ones, temporary paths come from tmp_path(_factory).
- Folders and files that must share one worker are named in SHARED_WORKER: tests/web (its
  modules share one `trainyard up` and one Chromium, tests/web/conftest.py), tests/hosts (one
  set of network namespaces at a time), and `busy`: the bench smoke runs and the service
  clusters, one at a time. A new file of that kind is added there;
  `xdist_group` marks have no effect (see FileGroupScheduling).
- Files are handed out heaviest first (the most tests marked `slow`, `e2e` or `hosts`), so
  that the long ones do not start last; `--no-loadscope-reorder` keeps that order. A test that
  starts a service, a cluster or several training processes is marked `slow`.

Plain `pytest` (no `-n`) runs serially as before; so does `make test TEST_WORKERS=0`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from xdist.scheduler import LoadScopeScheduling

from dsl.compiler import CompiledJob, compile_job
from workers.data import Dataset, TrainingData

torch.set_num_threads(1)
if "PYTEST_XDIST_WORKER" in os.environ:
    # An xdist worker starts with COLUMNS=80 and LINES=24 set: the CLI's rich consoles, made
    # at import, would keep 80 columns for good and ignore the COLUMNS a test gives CliRunner.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


# -- two test processes (pytest-xdist): the conventions of this file's docstring.

# Folders and files that share one worker, and the group that holds them. `busy`: the bench
# smoke runs (three scripts at once) and the service clusters never run together. (The
# clusters' liveness timeouts are long enough besides: 6 s of an agent's silence restarted a
# job when they ran together, and a test that a silent node is lost kills its agent outright.)
SHARED_WORKER = {
    "tests/web/": "browser",
    "tests/hosts/": "hosts",
    "tests/test_bench_smoke.py": "busy",
    "tests/scheduler/agent/test_node_agent.py": "busy",
    "tests/scheduler/agent/test_confinement.py": "busy",
    "tests/scheduler/test_faults.py": "busy",
    "tests/scheduler/test_start_failures.py": "busy",
}

# Marks of tests that take long (a service, a cluster, a browser, test hosts of their own).
HEAVY_MARKS = ("slow", "e2e", "hosts")


def worker_group(nodeid: str) -> str:
    """The unit xdist hands to one worker: a test's file, or its folder's group."""
    path = nodeid.split("::", 1)[0]
    return next((g for folder, g in SHARED_WORKER.items() if path.startswith(folder)), path)


class FileGroupScheduling(LoadScopeScheduling):
    """`--dist loadfile` with SHARED_WORKER's folders as one file each. (xdist's own
    `loadgroup` marks a group in the test's id, which pytest 9.2 no longer reads back.)"""

    def _split_scope(self, nodeid: str) -> str:
        return worker_group(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return FileGroupScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


# Fixtures that make a test heavy whatever its marks: a `trainyard up` stack, or examples
# trained for it. Such a test is marked `slow`, so that `make check` leaves it out.
HEAVY_FIXTURES = {"stack", "stack_factory", "trained_runs"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that uses a HEAVY_FIXTURES fixture is `slow`; no test takes both an empty
    and a migrated database (on PostgreSQL they are one database: the first would be undone).
    Then, on an xdist worker: the groups with the most heavy tests (HEAVY_MARKS) first, so
    that the longest do not start last (every worker orders alike, as xdist requires)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & HEAVY_FIXTURES and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if {"sql_url", "migrated_sql_url"} <= names:
            raise pytest.UsageError(
                f"{item.nodeid} takes both sql_url and migrated_sql_url (or db): take one"
            )
    if not hasattr(config, "workerinput"):
        return
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(worker_group(item.nodeid), []).append(item)
    heaviest = sorted(
        groups.values(),
        key=lambda group: -sum(any(i.get_closest_marker(m) for m in HEAVY_MARKS) for i in group),
    )
    items[:] = [item for group in heaviest for item in group]


def missing_component(reason: str) -> None:
    """A real component some tests need (Chromium, Java) is missing: they skip, except under
    CI=true, where a missing component is an error (scripts/ensure-apt.sh exits 1 there too)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a missing component fails CI)", pytrace=False)
    pytest.skip(reason)


def compile_with_data(
    document: str | Mapping[str, Any],
    *,
    cache_dir: Path,
    base_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    filename: str = "<job>",
) -> tuple[CompiledJob, Dataset]:
    """A job compiled as a training run compiles it, with the samples it loaded."""
    data = TrainingData(cache_dir=cache_dir, base_dir=base_dir)
    return compile_job(document, data, overrides=overrides, filename=filename), data.dataset


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TRAINYARD_DATA_DIR for tests that run the CLI; its cache/ is `cache_dir`."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def cache_dir(data_dir: Path) -> Path:
    """One data cache for the whole session, shared by direct loads and the CLI (which reads
    TRAINYARD_DATA_DIR/cache), so mnist1d is generated once."""
    path = data_dir / "cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def cli_env(data_dir: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the CLI at the session's data directory; returns it."""
    monkeypatch.setenv("TRAINYARD_DATA_DIR", str(data_dir))
    return data_dir


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private, real redis-server for the test session (started by our embedded launcher),
    with a password as `trainyard up` gives it: every client in the tests must use the URL."""
    import secrets

    from scheduler.cli.redis_server import RedisServer

    password = secrets.token_urlsafe(16)
    server = RedisServer(tmp_path_factory.mktemp("redis"), persist=False, password=password)
    url = server.start()
    yield url
    server.stop()


def _postgres_database() -> Iterator[str | None]:
    import uuid

    import sqlalchemy as sa

    admin_url = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    name = f"trainyard_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        print(f"\n!!! PostgreSQL at 127.0.0.1:5432 unreachable ({exc}); its tests are SKIPPED !!!")
        yield None
        return
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str | None]:
    yield from _postgres_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_backend(request: pytest.FixtureRequest) -> str:
    """Each store/API test runs against SQLite and the machine's PostgreSQL; a file whose
    tests do not depend on the dialect names one (`parametrize("sql_backend", ["sqlite"],
    indirect=True)`)."""
    backend: str = request.param
    return backend


@pytest.fixture
def sql_url(sql_backend: str, tmp_path: Path, postgres_url: str | None) -> str:
    """An empty database, no schema: a fresh SQLite file, or the session's PostgreSQL database
    with its schema dropped."""
    if sql_backend == "sqlite":
        return f"sqlite:///{tmp_path / 'trainyard.db'}"
    return fresh_postgres(postgres_url)


def fresh_postgres(postgres_url: str | None) -> str:
    """The session's PostgreSQL database with a clean, empty schema (skipped, loudly at the
    session's start, where PostgreSQL is unreachable)."""
    if postgres_url is None:
        pytest.skip("PostgreSQL at 127.0.0.1:5432 is unreachable")
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    return postgres_url


@pytest.fixture
def db(migrated_sql_url: str) -> Iterator[Any]:
    """A migrated database on each SQL backend (scheduler/store/database.py), disposed after."""
    from scheduler.store.database import Database

    database = Database(migrated_sql_url)
    yield database
    database.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store migrated once per session, for tests to copy instead of migrating."""
    import sqlite3

    from scheduler.store.database import migrate

    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    migrate(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:  # fold the WAL into the file, so one copy is whole
        conn.execute("PRAGMA journal_mode=DELETE")
    return path


@pytest.fixture
def migrated_sql_url(
    sql_backend: str, tmp_path: Path, sqlite_template: Path, postgres_url: str | None
) -> str:
    """A database at the newest schema, with no rows: SQLite copies the session's migrated
    file, PostgreSQL empties the session's database where a test before left it migrated (the
    same migrations, run once a session either way)."""
    import shutil

    if sql_backend == "sqlite":
        path = tmp_path / "trainyard.db"
        shutil.copyfile(sqlite_template, path)
        return f"sqlite:///{path}"
    return migrated_postgres(postgres_url)


def migrated_postgres(postgres_url: str | None) -> str:
    """The session's PostgreSQL database at the newest schema with every table empty: emptied
    by TRUNCATE when a test before left it migrated, else dropped and migrated."""
    if postgres_url is None:
        pytest.skip("PostgreSQL at 127.0.0.1:5432 is unreachable")
    import sqlalchemy as sa
    from alembic.script import ScriptDirectory

    from scheduler.store.database import alembic_config, migrate

    head = ScriptDirectory.from_config(alembic_config(postgres_url)).get_current_head()
    engine = sa.create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            tables = sa.inspect(conn).get_table_names()
            at = None
            if "alembic_version" in tables:
                at = conn.scalar(sa.text("SELECT version_num FROM alembic_version"))
            rows = [f'"{name}"' for name in tables if name != "alembic_version"]
            if at == head and rows:
                conn.execute(sa.text(f"TRUNCATE {', '.join(rows)} RESTART IDENTITY CASCADE"))
                return postgres_url
    finally:
        engine.dispose()
    migrate(fresh_postgres(postgres_url))
    return postgres_url


# -- a real local stack for SDK, CLI and stack tests: `trainyard up` as a subprocess in a tmp
# data dir. It starts its own redis-server, SQLite file, API server, scheduler and node agent,
# exactly as a user's `trainyard up` does.
START_TIMEOUT = 120.0


@dataclass
class RunningStack:
    process: subprocess.Popen[bytes]
    data_dir: Path
    url: str
    token: str
    output: Path

    def env(self) -> dict[str, str]:
        """An environment whose Settings find this stack (and nothing of the caller's)."""
        return clean_env(TRAINYARD_DATA_DIR=str(self.data_dir))

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM), without waiting."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> int:
        self.terminate()
        return self.process.wait(timeout=timeout)

    def output_text(self) -> str:
        return self.output.read_text(errors="replace")


def clean_env(**extra: str) -> dict[str, str]:
    """Our environment without any Trainyard/Redis/SQL configuration, plus `extra`."""
    drop = ("TRAINYARD_", "REDIS_", "DATABASE_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    # COLUMNS: rich wraps lines at 80 columns when it writes to a file.
    env.update(
        {"TRAINYARD_NODE_SLOTS": "2", "TRAINYARD_HEARTBEAT_SECONDS": "1", "COLUMNS": "200", **extra}
    )
    return env


def start_stack(
    data_dir: Path, *extra_args: str, env: dict[str, str] | None = None
) -> RunningStack:
    """`trainyard up` on a free port; returns once the stack file says it is up. Without `env`
    it starts its own Redis and SQLite; `env` may point it at others (REDIS_URL, ...)."""
    from scheduler.cli.redis_server import free_port
    from scheduler.cli.stack import read_stack_file

    data_dir.mkdir(parents=True, exist_ok=True)
    output = data_dir.parent / f"{data_dir.name}-up.out"
    port = free_port()
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "scheduler", "up"),
                *("--port", str(port), "--data-dir", str(data_dir)),
                *extra_args,
            ],
            cwd=ROOT,
            env=clean_env(**(env or {})),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        found = read_stack_file(data_dir / "stack.json")
        if found is not None and found.pid == process.pid:
            return RunningStack(process, data_dir, found.url, found.token, output)
        if process.poll() is not None:
            raise RuntimeError(f"trainyard up exited {process.returncode}:\n{output.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"trainyard up did not come up in {START_TIMEOUT}s:\n{output.read_text()}")


@pytest.fixture(scope="session")
def stack_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., RunningStack]]:
    started: list[RunningStack] = []

    def make(
        *extra_args: str, data_dir: Path | None = None, env: dict[str, str] | None = None
    ) -> RunningStack:
        where = data_dir or tmp_path_factory.mktemp("stack") / "data"
        running = start_stack(where, *extra_args, env=env)
        started.append(running)
        return running

    yield make
    # Signal every stack before waiting for any: each takes seconds to stop its children.
    for running in started:
        running.terminate()
    for running in started:
        running.process.wait(timeout=30.0)


@pytest.fixture(scope="session")
def stack(stack_factory: Callable[..., RunningStack]) -> RunningStack:
    """One stack shared by the SDK and CLI tests of the session. Its scheduler may send
    webhooks to loopback addresses, where the tests' receivers listen (a webhook reaches only
    public addresses unless the setting allows more)."""
    return stack_factory(env={"TRAINYARD_WEBHOOK_ALLOW": "127.0.0.0/8"})


@dataclass
class TrainedRun:
    """A few steps of an example trained in this process: its run directory, its test split,
    and the scores its net gave the test split at the end (the latest checkpoint's)."""

    name: str
    run_dir: Path
    x_test: torch.Tensor
    y_test: torch.Tensor
    scores: torch.Tensor  # what fed the loss layer


# Examples trained once a session for the tests of models leaving the platform: the steps, and
# checkpoints every half of them (keep_best on, so a run has a best and a latest checkpoint).
# char_gpt is the net of repeated blocks (layers named block.0.ln1), on batches of 4.
TRAINED_EXAMPLES = {"digits_mlp": 40, "mnist1d_cnn": 30, "char_gpt": 6}
SMALLER = {"char_gpt": {"data.batch_size": 4}}


@pytest.fixture(scope="session")
def trained_runs(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> dict[str, TrainedRun]:
    from workers.trainer import Trainer, TrainOptions

    runs = {}
    for name, steps in TRAINED_EXAMPLES.items():
        overrides = {
            "train_steps": steps,
            "test.freq": steps // 2,
            "checkpoint.freq": steps // 2,
            "checkpoint.keep": 3,
            "checkpoint.keep_best": True,
            **SMALLER.get(name, {}),
        }
        path = EXAMPLES / f"{name}.yaml"
        compiled, dataset = compile_with_data(
            path.read_text(), cache_dir=cache_dir, overrides=overrides
        )
        run_dir = tmp_path_factory.mktemp("runs") / name
        Trainer(compiled, dataset, TrainOptions(run_dir=run_dir)).run()
        net = compiled.net.eval()
        loss = next(s for s in net.steps("test") if s.module.is_loss)
        with torch.no_grad():
            out = net(dataset.x_test, dataset.y_test, "test").outputs[loss.sources[0].layer]
        assert isinstance(out, torch.Tensor)
        runs[name] = TrainedRun(name, run_dir, dataset.x_test, dataset.y_test, out)
    return runs


# The example plugin (docs/plugins.md): the layer rmsnorm, the updater signsgd.
PLUGIN = ROOT / "tests" / "fixtures" / "plugin_dist" / "trainyard_rmsnorm.py"
PLUGIN_BLOCKS = """\
name: rmsnorm-blocks
data: {source: synthetic, task: classification, num_samples: 64, num_features: 8, batch_size: 16}
neuralnet:
  layers:
    - {name: data, type: input}
    - name: block
      type: repeat
      times: 2
      srclayers: [data]
      layers:
        - {name: norm, type: rmsnorm, srclayers: [block]}
    - {name: out, type: dense, srclayers: [block]}
    - {name: loss, type: softmax_loss, srclayers: [out]}
updater: {type: sgd, lr: {base: 0.1}}
train_steps: 2
"""


@pytest.fixture(scope="session")
def plugin_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The run directory of a net of repeated blocks with the plugin's layer (block.0.norm,
    block.1.norm), trained in this process, the plugin unloaded again after."""
    from dsl.plugins import load_plugins, unloaded_after
    from workers.trainer import Trainer, TrainOptions

    run_dir = tmp_path_factory.mktemp("runs") / "rmsnorm-blocks"
    with unloaded_after():
        load_plugins([str(PLUGIN)])
        compiled, dataset = compile_with_data(PLUGIN_BLOCKS, cache_dir=cache_dir)
        Trainer(compiled, dataset, TrainOptions(run_dir=run_dir)).run()
    return run_dir
