"""docs/operations.md stays true: its settings table is the Settings model's, and the commands
it tells operators to run exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import typer.main
from pydantic.fields import FieldInfo

from contract.settings import Settings
from scheduler.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "operations.md"
START, END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"


def env_names(name: str, info: FieldInfo) -> list[str]:
    choices = getattr(info.validation_alias, "choices", None)
    if choices:
        return [str(choice).upper() for choice in choices]
    return [f"TRAINYARD_{name.upper()}"]


def default_text(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return "(computed)"
    if info.default is None:
        return "unset"
    return f"`{info.default}`"


def settings_table() -> str:
    """The Markdown table of every setting, generated from contract/settings.py."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, info in Settings.model_fields.items():
        variables = " or ".join(f"`{env}`" for env in env_names(name, info))
        rows.append(f"| {variables} | {default_text(info)} | {info.description or ''} |")
    return "\n".join(rows)


def test_every_setting_has_a_description() -> None:
    missing = [name for name, info in Settings.model_fields.items() if not info.description]
    assert not missing, f"Settings fields without description=: {missing}"


def test_settings_table_is_generated_from_settings() -> None:
    text = DOC.read_text()
    assert START in text and END in text
    current = text.split(START, 1)[1].split(END, 1)[0].strip()
    expected = settings_table()
    assert current == expected, f"regenerate the table in docs/operations.md:\n{expected}"


def test_trainyard_commands_in_the_doc_exist() -> None:
    root: Any = typer.main.get_command(app)
    lines = re.findall(r"^\s*(?:\$ )?trainyard ([a-z][^\n#]*)", DOC.read_text(), re.MULTILINE)
    assert len(lines) >= 5
    for line in lines:
        command = root
        for word in shlex.split(line.replace("\\", "")):
            if word.startswith("-") or not hasattr(command, "commands"):
                break
            assert word in command.commands, f"`trainyard {line}`: no command {word!r}"
            command = command.commands[word]
