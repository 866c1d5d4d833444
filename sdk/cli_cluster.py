"""Cluster commands of the `trainyard` CLI: `scheduler` and `worker` (a node agent)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Annotated, Any

import typer
from rich.console import Console

from contract.settings import Settings

err_console = Console(stderr=True)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _settings(**given: Any) -> Settings:
    settings = Settings(**{k: v for k, v in given.items() if v is not None})
    if not settings.redis_url:
        err_console.print(
            "[bold red]error[/] no Redis to connect to: set REDIS_URL to the stack's Redis "
            "(`trainyard up` prints it; it is also in the stack's stack.json)"
        )
        raise typer.Exit(2)
    return settings


def scheduler(
    migrate_db: Annotated[
        bool, typer.Option("--migrate/--no-migrate", help="upgrade the SQL schema first")
    ] = True,
) -> None:
    """Run the scheduler: node tracking, gang placement of queued jobs, metric ingestion."""
    from scheduler.db import migrate
    from scheduler.loop import run_scheduler

    settings = _settings()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if migrate_db:
        migrate(settings.sql_url())
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    run_scheduler(settings, stop)


def worker(
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
    from scheduler.agent import run_agent

    settings = _settings(node_name=name, node_slots=slots, node_gpus=gpus)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    run_agent(settings)


def register(app: typer.Typer) -> None:
    app.command()(scheduler)
    app.command()(worker)
