"""`trainyard login` (a server, by default or as a named profile) and `trainyard tokens
list|create|revoke` (your own API tokens)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from trainyard import cli_client
from trainyard.cli_client import AsJson, connect, print_json, reporting
from trainyard.client import Client
from trainyard.connection import check_profile_name, save_login

console = Console()
err_console = Console(stderr=True)


def login(
    url: Annotated[str, typer.Argument(help="the server, e.g. http://host:8000")],
    token: Annotated[str | None, typer.Option(help="API token (asked for when not given)")] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="save it under this name (use it with `trainyard --profile NAME ...` or "
            "TRAINYARD_PROFILE) instead of as the default server",
        ),
    ] = None,
) -> None:
    """Check a server address and token, and remember them for the CLI and SDK."""
    settings = cli_client.settings()
    name = profile or settings.profile
    with reporting():
        if name:
            check_profile_name(name)
        if token is None:
            token = typer.prompt("API token", hide_input=True)
        with Client(url, token) as client:
            client.get_json("/jobs", limit=1)
        path = save_login(settings, url.rstrip("/"), token, name)
    where = f" as profile {name}" if name else ""
    console.print(f"logged in to {url}{where}; saved in {path}")


tokens_app = typer.Typer(
    help="Your API tokens: list them, create one (its secret shown once), revoke one.",
    no_args_is_help=True,
)


@tokens_app.command("list")
def list_tokens(as_json: AsJson = False) -> None:
    """Your tokens (never their secrets), oldest first."""
    client = connect()
    with reporting():
        found = client.tokens()
    if as_json:
        print_json([t.model_dump(mode="json") for t in found])
        return
    table = Table(title=f"{len(found)} token(s)", title_justify="left")
    for column in ("id", "name", "created", "expires", "last used"):
        table.add_column(column, justify="right" if column == "id" else "left")
    for t in found:
        table.add_row(
            str(t.id),
            t.name,
            t.created_at.strftime("%Y-%m-%d %H:%M"),
            t.expires_at.strftime("%Y-%m-%d %H:%M") if t.expires_at else "never",
            t.last_used_at.strftime("%Y-%m-%d %H:%M") if t.last_used_at else "-",
        )
    console.print(table)


@tokens_app.command()
def create(
    name: Annotated[str, typer.Argument(help="a name of yours for it", show_default=False)],
    expires_in_days: Annotated[
        int | None,
        typer.Option(min=1, help="it expires after this many days (never after the token used)"),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Create a token; its secret is printed this once (stdout: the secret alone, or JSON)."""
    client = connect()
    with reporting():
        created = client.create_token(name, expires_in_days)
    if as_json:
        print_json(created.model_dump(mode="json"))
        return
    expires = created.expires_at.isoformat(timespec="seconds") if created.expires_at else "never"
    err_console.print(
        f"created token {created.id} ({created.name}), expires {expires}; the secret, shown "
        "this once:"
    )
    typer.echo(created.token)


@tokens_app.command()
def revoke(
    token_id: Annotated[int, typer.Argument(help="the token's id (tokens list)")],
) -> None:
    """Revoke a token at once (and every token it minted)."""
    client = connect()
    with reporting():
        client.revoke_token(token_id)
    console.print(f"revoked token {token_id}")


def register(app: typer.Typer) -> None:
    app.command()(login)
    app.add_typer(tokens_app, name="tokens")
