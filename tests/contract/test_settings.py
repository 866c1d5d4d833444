"""The one Settings object: what it accepts from the environment and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from contract.settings import Settings


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///relative.db",
        "sqlite:////abs/path/trainyard.db",
        "sqlite+pysqlite:///x.db",
        "postgresql://trainyard@db-host/trainyard",
        "postgresql+psycopg://trainyard:secret@db-host:5432/trainyard",
    ],
)
def test_sqlite_and_postgresql_urls_are_taken_as_given(url: str, tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path, database_url=url).sql_url() == url


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("mysql://u@h/db", "mysql"),
        ("mariadb+pymysql://u@h/db", "mariadb+pymysql"),
        ("postgres://u@h/db", "postgres"),
        ("trainyard.db", "trainyard.db"),
    ],
)
def test_other_databases_are_refused_with_the_two_that_work(
    url: str, scheme: str, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(data_dir=tmp_path, database_url=url)
    message = str(raised.value)
    assert f"DATABASE_URL names {scheme!r}" in message
    assert "sqlite:///PATH" in message and "postgresql+psycopg://" in message


def test_unset_means_a_sqlite_file_in_the_data_directory(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.sql_url() == f"sqlite:///{tmp_path / 'trainyard.db'}"


def test_urls_are_shown_without_their_passwords() -> None:
    from contract.settings import redacted

    assert redacted("redis://:p%40ss@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert redacted("postgresql+psycopg://u:pw@db:5432/t") == "postgresql+psycopg://u:***@db:5432/t"
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redacted("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_webhook_allow_is_a_list_of_networks_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_WEBHOOK_ALLOW", "10.1.0.0/16, fd00::/8,192.168.5.7")
    networks = Settings(data_dir=tmp_path).webhook_networks()
    assert [str(network) for network in networks] == ["10.1.0.0/16", "fd00::/8", "192.168.5.7/32"]
    assert Settings(data_dir=tmp_path, webhook_allow=None).webhook_networks() == []
    with pytest.raises(ValidationError, match=r"webhook_allow: .*10\.1\.0\.0/33"):
        Settings(data_dir=tmp_path, webhook_allow="10.1.0.0/33")
