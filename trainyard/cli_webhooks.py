"""`trainyard webhooks add|list|remove`: URLs the server tells when jobs finish or fail and
sweeps end (deliveries signed with the hook's secret: docs/integrations.md)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from trainyard.cli_client import AsJson, connect, reporting

EVENTS = ("job.finished", "job.failed", "sweep.finished")

console = Console()
err_console = Console(stderr=True)

webhooks_app = typer.Typer(
    help="Webhooks: URLs the server POSTs signed events to (job.finished, job.failed, "
    "sweep.finished).",
    no_args_is_help=True,
)


@webhooks_app.command()
def add(
    url: Annotated[str, typer.Argument(help="an http:// or https:// URL", show_default=False)],
    events: Annotated[
        str, typer.Option(help="comma-separated, among " + ", ".join(EVENTS))
    ] = ",".join(EVENTS),
    as_json: AsJson = False,
) -> None:
    """Register a webhook; prints its secret, shown this once: keep it to verify deliveries."""
    wanted = [event.strip() for event in events.split(",") if event.strip()]
    unknown = [event for event in wanted if event not in EVENTS]
    if unknown or not wanted:
        err_console.print(
            f"[bold red]error[/] --events: {', '.join(unknown) or 'none given'} "
            f"(known: {', '.join(EVENTS)})"
        )
        raise typer.Exit(2)
    client = connect()
    with reporting():
        hook = client.add_webhook(url, wanted)
    if as_json:
        sys.stdout.write(hook.model_dump_json() + "\n")
        return
    console.print(f"webhook {hook.id}: {hook.url} ({', '.join(hook.events)})", highlight=False)
    console.print(f"secret {hook.secret}", highlight=False)
    console.print("[dim]shown this once: deliveries are signed with it (Trainyard-Signature)[/]")


@webhooks_app.command("list")
def list_hooks(as_json: AsJson = False) -> None:
    """Your webhooks and how their last delivery went."""
    client = connect()
    with reporting():
        hooks = client.webhooks()
    if as_json:
        sys.stdout.write(json.dumps([h.model_dump(mode="json") for h in hooks]) + "\n")
        return
    table = Table("id", "url", "events", "last delivery", "pending")
    for hook in hooks:
        last = "never"
        if hook.last_delivery_at is not None:
            when = hook.last_delivery_at.isoformat(timespec="seconds")
            last = f"{hook.last_event} {hook.last_status} ({when})"
        table.add_row(str(hook.id), hook.url, ",".join(hook.events), last, str(hook.pending))
    console.print(table)


@webhooks_app.command()
def remove(
    webhook_id: Annotated[int, typer.Argument(help="the webhook's id", show_default=False)],
) -> None:
    """Remove a webhook; what waits to be sent to it is dropped."""
    client = connect()
    with reporting():
        client.remove_webhook(webhook_id)
    console.print(f"removed webhook {webhook_id}")


def register_commands(app: typer.Typer) -> None:
    app.add_typer(webhooks_app, name="webhooks")
