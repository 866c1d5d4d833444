"""Where the server is: the address and token the SDK and CLI use, and the files that hold them.

`trainyard login` writes <data_dir>/client.json; `trainyard up` writes <data_dir>/stack.json
(scheduler/cli/stack.py) with the same two keys, so a client on that machine finds the local stack.
`trainyard login --profile NAME` saves a named server in client.json's `profiles`; `--profile
NAME` (or TRAINYARD_PROFILE) then picks it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract.settings import Settings
from dsl.registry import did_you_mean
from trainyard.errors import TrainyardError

PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Connection(BaseModel):
    # stack.json holds more than these two keys; the client reads what it needs.
    model_config = ConfigDict(extra="ignore")

    url: str | None = None
    token: str | None = None


class ClientFile(Connection):
    """client.json: the default server, and the named ones."""

    profiles: dict[str, Connection] = Field(default_factory=dict)


def _read_connection(path: Path) -> Connection:
    try:
        return Connection.model_validate_json(path.read_text())
    except (OSError, ValidationError):
        return Connection()


def read_client_file(settings: Settings) -> ClientFile:
    try:
        return ClientFile.model_validate_json(client_file(settings).read_text())
    except (OSError, ValidationError):
        return ClientFile()


def client_file(settings: Settings) -> Path:
    """Written by `trainyard login`: {url, token} of a remote server, and named `profiles`."""
    return settings.resolved_data_dir() / "client.json"


def check_profile_name(name: str) -> str:
    if not PROFILE_NAME.match(name):
        raise TrainyardError(
            f"profile name {name!r}: letters, digits, '.', '_' and '-', at most 64, starting "
            "with a letter or digit"
        )
    return name


def resolve_connection(settings: Settings) -> Connection:
    """The server address and token.

    A profile (settings.profile: `--profile`, TRAINYARD_PROFILE) is used as saved; an unknown
    one raises, with the known names. Without one: environment > `trainyard login` file > local
    stack file; the token comes from the environment, else from the first file that names the
    chosen URL, so a login to one server never sends its token to another.
    """
    saved = read_client_file(settings)
    if settings.profile:
        found = saved.profiles.get(settings.profile)
        if found is None:
            known = sorted(saved.profiles)
            hint = did_you_mean(settings.profile, known)
            raise TrainyardError(
                f"no profile {settings.profile!r}"
                + (f"; {hint}" if hint else "")
                + (f" (saved: {', '.join(known)})" if known else " (none saved)")
                + f"; save one with `trainyard login URL --profile {settings.profile}`"
            )
        return found
    files = [Connection(url=saved.url, token=saved.token), _read_connection(settings.stack_file())]
    url = settings.url or next((f.url for f in files if f.url), None)
    token = settings.token or next((f.token for f in files if f.url == url and f.token), None)
    return Connection(url=url, token=token)


def save_login(settings: Settings, url: str, token: str, profile: str | None) -> Path:
    """Remember a server: as the default, or as the named `profile` (the others kept)."""
    saved = read_client_file(settings)
    if profile:
        saved.profiles[check_profile_name(profile)] = Connection(url=url, token=token)
    else:
        saved.url, saved.token = url, token
    path = client_file(settings)
    write_private_json(path, saved.model_dump(exclude_defaults=True))
    return path


def write_private_json(path: Path, data: dict[str, object]) -> None:
    """Write a file only its owner can read (it holds a token), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
