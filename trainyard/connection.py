"""Where the server is: the address and token the SDK and CLI use, and the files that hold them.

`trainyard login` writes <data_dir>/client.json; `trainyard up` writes <data_dir>/stack.json
(scheduler/cli/stack.py) with the same two keys, so a client on that machine finds the local stack.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from contract.settings import Settings


class Connection(BaseModel):
    # stack.json holds more than these two keys; the client reads what it needs.
    model_config = ConfigDict(extra="ignore")

    url: str | None = None
    token: str | None = None


def _read_connection(path: Path) -> Connection:
    try:
        return Connection.model_validate_json(path.read_text())
    except (OSError, ValidationError):
        return Connection()


def client_file(settings: Settings) -> Path:
    """Written by `trainyard login`: {url, token} of a remote server."""
    return settings.resolved_data_dir() / "client.json"


def resolve_connection(settings: Settings) -> Connection:
    """The server address and token: environment > `trainyard login` file > local stack file.

    The token comes from the environment, else from the first file that names the chosen URL,
    so a login to one server never sends its token to another.
    """
    files = [_read_connection(client_file(settings)), _read_connection(settings.stack_file())]
    url = settings.url or next((f.url for f in files if f.url), None)
    token = settings.token or next((f.token for f in files if f.url == url and f.token), None)
    return Connection(url=url, token=token)


def write_private_json(path: Path, data: dict[str, object]) -> None:
    """Write a file only its owner can read (it holds a token), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
