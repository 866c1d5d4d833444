"""Trainyard command line."""
import typer

app = typer.Typer()


def main() -> None:
    app()
