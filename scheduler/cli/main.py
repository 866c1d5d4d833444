"""The `trainyard` command: the client commands of the SDK (trainyard/cli.py), the local ones that
train in this process (scheduler/cli/local.py), and the server's: `up` (the whole local stack),
`api` (one server), `scheduler`, `worker` (a node agent) and `admin` (direct database access).

The heavy imports (torch, SQLAlchemy, uvicorn, Celery) wait inside the commands' bodies, so
the client commands start fast (tests/test_structure.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from contract.settings import Settings, redacted
from scheduler.cli import local as cli_local
from scheduler.cli.admin import admin_app
from trainyard import cli as client_cli

console = Console()
err_console = Console(stderr=True)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

Host = Annotated[str | None, typer.Option(help="address to listen on [default: 127.0.0.1]")]
Port = Annotated[int | None, typer.Option(help="port to listen on [default: 8000]")]


def _settings(**given: Any) -> Settings:
    """Settings from the environment, with the command line's explicit values on top."""
    return Settings(**{k: v for k, v in given.items() if v is not None})


def _private_data(settings: Settings) -> None:
    """What a server process writes is its owner's alone: the umask makes files 0600 and
    folders 0700, and its children inherit it (the SQLite file, logs, run directories and
    checkpoints, datasets, the embedded Redis's files); the data and artifact directories
    themselves are made 0700, which also closes what an older version left readable."""
    os.umask(0o077)
    for folder in (settings.resolved_data_dir(), settings.artifacts()):
        folder.mkdir(parents=True, exist_ok=True)
        try:
            folder.chmod(0o700)
        except PermissionError:  # a shared volume another user owns: its modes are theirs
            err_console.print(f"note: cannot make {folder} private (mode 0700): not its owner")


def _follow(url: str, token: str, job_file: Path, stop: threading.Event, where: str) -> None:
    """Submit a job (or sweep) to the fresh stack, show its progress, print the result (a
    thread)."""
    from trainyard.client import Client, Job, TrainyardError
    from trainyard.progress import follow_with_progress
    from trainyard.sweeps import follow_sweep

    try:
        with Client(url, token) as client:
            job = client.submit(job_file)
            kind = "job" if isinstance(job, Job) else "sweep"
            console.print(f"submitted {job_file} as {kind} [bold]{job.id}[/]")
            if isinstance(job, Job):
                follow_with_progress(job, console=console, stop=stop)
            else:  # its table ends with the sweep's result
                follow_sweep(job, console=console, stop=stop)
    except TrainyardError as exc:
        if not stop.is_set():
            err_console.print(f"[bold red]error[/] {exc}")
        return
    if not job.done:
        return
    if isinstance(job, Job):
        final = "  ".join(
            f"{key} {value:.4f}"
            for key, value in sorted(job.summary.items())
            if isinstance(value, int | float) and key.startswith(("test/", "train/"))
        )
        console.print(f"job {job.id} [bold]{job.state}[/] after {job.step} steps   {final}")
        if job.error:
            console.print(f"[red]error[/] {job.error}")
    console.print(f"the stack keeps running: {where}\nadmin token: {token}   Ctrl-C stops it")


def up(
    host: Host = None,
    port: Port = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="state directory [default: ~/.trainyard]")
    ] = None,
    submit: Annotated[
        Path | None,
        typer.Option(help="once up, submit this job and follow it until it ends (`make run`)"),
    ] = None,
) -> None:
    """Start the whole service here: Redis, API, scheduler and a node agent, until Ctrl-C."""
    from scheduler.cli.stack import Stack, StackError

    settings = _settings(host=host, port=port, data_dir=data_dir)
    _private_data(settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stack = Stack(settings, say=err_console.print)
    console.print(f"starting the stack in {stack.data_dir} ...")
    try:
        stack.start()
    except StackError as exc:
        err_console.print(f"[bold red]error[/] {exc}")
        raise typer.Exit(1) from None
    where = f"API {stack.url}/api/v1   docs {stack.url}/docs"
    if stack.serves_dashboard():
        where += f"   dashboard {stack.url}/"
    console.print(
        f"[bold green]trainyard is up[/]: {where}\n"
        f"admin token: {stack.token}\n"
        f"(saved in {settings.stack_file()}; the CLI and SDK on this machine use it)\n"
        f"process logs: {stack.data_dir / 'logs'}   Ctrl-C stops everything"
    )
    follower = threading.Thread(
        target=_follow, args=(stack.url, stack.token, submit, stop, where), daemon=True
    )
    if submit is not None:
        follower.start()
    dead = stack.watch(stop)
    stop.set()
    if follower.is_alive():
        follower.join(timeout=5)  # it closes its progress bar
    if dead is not None:
        err_console.print(f"[bold red]error[/] {stack.death_notice(dead)}")
    console.print("stopping the stack ...")
    stack.stop()
    console.print("stopped.")
    if dead is not None:
        raise typer.Exit(1)


def api(
    host: Host = None,
    port: Port = None,
    migrate_db: Annotated[
        bool, typer.Option("--migrate/--no-migrate", help="upgrade the SQL schema first")
    ] = True,
    access_log: Annotated[bool, typer.Option(help="log every request")] = False,
    workers: Annotated[
        int, typer.Option(min=1, help="server processes (each builds the app from the env)")
    ] = 1,
) -> None:
    """Run the API server alone (docker-compose's api service; `trainyard up` starts one)."""
    import uvicorn

    from scheduler.store.database import migrate

    settings = _settings(host=host, port=port)
    if not settings.redis_url:
        err_console.print(
            "error: the API server needs Redis: set REDIS_URL (`trainyard up` starts one and "
            "sets it)"
        )
        raise typer.Exit(2)
    _private_data(settings)  # the default SQLite file lives there
    if migrate_db:
        migrate(settings.sql_url())
    # By its import path, so the scheduler package does not import the API's: each process
    # builds its app from the environment (host and port are uvicorn's, not the app's).
    uvicorn.run(
        "api.app:create_app",
        factory=True,
        workers=workers,
        host=settings.host,
        port=settings.port,
        access_log=access_log,
        log_level="info",
    )


def _cluster_settings(**given: Any) -> Settings:
    """Settings for a cluster process, which needs the stack's Redis."""
    settings = _settings(**given)
    if not settings.redis_url:
        err_console.print(
            "[bold red]error[/] no Redis to connect to: set REDIS_URL to the stack's Redis "
            "(`trainyard up` keeps it in the stack's stack.json, readable by its owner only)"
        )
        raise typer.Exit(2)
    return settings


def _require_redis_for_job_users(settings: Settings) -> None:
    """The scheduler creates each job's Redis user on the main Redis and the parameter-server
    ones: a server too old for those rules is refused now, not at a job's dispatch."""
    import redis

    from contract.keys import RedisTooOld, redis_server_name

    for url in dict.fromkeys([settings.redis_url or "", *settings.ps_urls()]):
        try:
            with redis.Redis.from_url(url, socket_timeout=10) as client:
                name = redis_server_name(client, job_users=settings.redis_job_users)
        except (redis.RedisError, RedisTooOld) as exc:
            err_console.print(f"[bold red]error[/] Redis at {redacted(url)}: {exc}")
            raise typer.Exit(2) from None
        logging.getLogger(__name__).info("redis: %s at %s", name, redacted(url))


def scheduler(
    migrate_db: Annotated[
        bool, typer.Option("--migrate/--no-migrate", help="upgrade the SQL schema first")
    ] = True,
) -> None:
    """Run the scheduler: node tracking, gang placement of queued jobs, metric ingestion."""
    from scheduler.daemon.loop import run_scheduler
    from scheduler.store.database import migrate

    settings = _cluster_settings()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    _require_redis_for_job_users(settings)
    _private_data(settings)  # the default SQLite file lives there
    if migrate_db:
        migrate(settings.sql_url())
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    run_scheduler(settings, stop)


def node(
    name: Annotated[
        str | None, typer.Option(help="node name [default: TRAINYARD_NODE_NAME or the hostname]")
    ] = None,
    slots: Annotated[
        int | None, typer.Option(help="CPU slots to offer [default: the CPU count]", min=1)
    ] = None,
    gpus: Annotated[
        int | None, typer.Option(help="GPUs to offer [default: those torch sees]", min=0)
    ] = None,
) -> None:
    """Start a node agent: run the job processes the scheduler places on this machine."""
    from scheduler.agent.node_agent import run_agent

    settings = _cluster_settings(node_name=name, node_slots=slots, node_gpus=gpus)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    _private_data(settings)  # run directories, checkpoints and logs of its processes
    run_agent(settings)


def worker(
    name: Annotated[str | None, typer.Option(help="see `trainyard node --help`")] = None,
    slots: Annotated[int | None, typer.Option(min=1)] = None,
    gpus: Annotated[int | None, typer.Option(min=0)] = None,
) -> None:
    """Deprecated: `trainyard node` (a "worker" is a training process). Kept for one release."""
    print(DEPRECATED_WORKER, file=sys.stderr)
    node(name=name, slots=slots, gpus=gpus)


DEPRECATED_WORKER = (
    "warning: `trainyard worker` is deprecated and will be removed in the next release; "
    "use `trainyard node` (same options)"
)
AGENT_COMMANDS = ("node", "worker")  # the node agent's command and its deprecated name


def register(app: typer.Typer) -> None:
    """Add the server commands to `app`."""
    for command in (up, api, scheduler, node):
        app.command()(command)
    app.command(hidden=True)(worker)
    app.add_typer(admin_app, name="admin")


app = client_cli.new_app()
cli_local.register(app)
client_cli.register(app)
register(app)


def main() -> None:
    """The `trainyard` console script (and `python -m scheduler`). Every process of the
    platform it starts (the API, the scheduler, node agents) loads the plugins first; a plugin
    that fails stops it with the plugin's name and error; a node agent (`node`) loads them
    itself, and reports one that fails on its node card instead (scheduler/agent/node_agent.py).
    """
    if sys.argv[1:2] not in [[command] for command in AGENT_COMMANDS]:
        load_plugins_or_exit()
    client_cli.run(app)


def load_plugins_or_exit() -> None:
    """Load the plugins, if any are installed or configured (dsl/plugins.py)."""
    from dsl import plugins

    if not plugins.wanted():
        return  # the client's commands start without torch
    try:
        plugins.load_plugins()
    except plugins.PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
