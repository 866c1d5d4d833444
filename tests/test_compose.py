"""docker-compose.yml and the Dockerfile name only things that exist, and start in a sane order."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import typer.main
import yaml

from contract.keys import ROLES, Keys
from contract.settings import Settings
from scheduler.cli.main import app
from scheduler.cli.stack import HEALTH_PATH

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {"api", "scheduler", "node", "redis", "redis-ps", "postgres"}
HEALTH_CHECKED = {"api", "redis", "redis-ps", "postgres"}


class _ComposeLoader(yaml.SafeLoader):
    """Compose's own YAML tags (`!reset`) read as plain values."""


_ComposeLoader.add_constructor("!reset", lambda loader, node: None)


def _load(name: str) -> dict[str, Any]:
    data = yaml.load((ROOT / name).read_text(), Loader=_ComposeLoader)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load("docker-compose.yml")


@pytest.fixture(scope="module")
def cli() -> Any:
    """The click command tree typer builds (typer ships its own click, so duck-typed here)."""
    command = typer.main.get_command(app)
    assert "up" in command.commands  # type: ignore[attr-defined]
    return command


def _resolve(group: Any, argv: list[str]) -> tuple[Any, list[str]]:
    """Walk `trainyard a b --x` down the command tree; returns the command and its arguments."""
    command = group
    rest = list(argv)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        sub = command.commands.get(rest[0])
        assert sub is not None, f"`trainyard {' '.join(argv)}`: no command {rest[0]!r}"
        command, rest = sub, rest[1:]
    return command, rest


def test_compose_has_every_service(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == SERVICES


def test_healthchecks_where_expected(compose: dict[str, Any]) -> None:
    for name in HEALTH_CHECKED:
        check = compose["services"][name].get("healthcheck")
        assert check and check["test"], f"{name} has no healthcheck"
    api_check = " ".join(compose["services"]["api"]["healthcheck"]["test"])
    assert f":8000{HEALTH_PATH}'" in api_check


def test_depends_on_waits_for_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert rule["condition"] in ("service_healthy", "service_started")
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
            if "healthcheck" in services[dependency]:
                assert rule["condition"] == "service_healthy", f"{name} -> {dependency}"
    # The API migrates the schema; the scheduler must not start before it.
    assert services["scheduler"]["depends_on"]["api"]["condition"] == "service_healthy"


def test_every_trainyard_command_exists(compose: dict[str, Any], cli: Any) -> None:
    commands = [s["command"] for s in compose["services"].values() if "command" in s]
    ours = [c for c in commands if c[0] == "trainyard"]
    assert len(ours) == 3
    for argv in ours:
        command, rest = _resolve(cli, argv[1:])
        known = {opt for param in command.params for opt in param.opts}
        for arg in rest:
            if arg.startswith("-"):
                assert arg in known, f"`{' '.join(argv)}`: {command.name} has no option {arg}"
        context = command.make_context(command.name, list(rest), resilient_parsing=False)
        assert context.command is command


def test_environment_is_read_by_settings(compose: dict[str, Any]) -> None:
    fields = Settings.model_fields
    names = set()
    for field_name, info in fields.items():
        names.add(f"TRAINYARD_{field_name.upper()}")
        alias = info.validation_alias
        choices = getattr(alias, "choices", [])
        names.update(str(choice).upper() for choice in choices)
    for service in ("api", "scheduler", "node"):
        env = compose["services"][service]["environment"]
        for key in env:
            assert key in names, f"{service}: {key} is not a Settings field"
    # Node agents need only Redis and the data directory, never the SQL store.
    assert "DATABASE_URL" not in compose["services"]["node"]["environment"]
    assert "DATABASE_URL" in compose["services"]["scheduler"]["environment"]


def test_a_node_reserves_gpus_and_scales(compose: dict[str, Any]) -> None:
    node = compose["services"]["node"]
    devices = node["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    # A fixed name or host port would stop `--scale node=N`.
    assert "container_name" not in node
    assert "ports" not in node


def test_cpu_override_drops_the_gpu_reservation() -> None:
    override = _load("docker-compose.cpu.yml")
    assert set(override["services"]) == {"node"}
    assert override["services"]["node"]["deploy"] is None


def test_dockerfile_copies_existing_paths() -> None:
    text = (ROOT / "Dockerfile").read_text()
    sources = [
        part
        for line in re.findall(r"^COPY (.+)$", text, flags=re.MULTILINE)
        for part in line.split()[:-1]
    ]
    assert "trainyard" in sources and "scheduler" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored


REDIS_PASSWORD = re.compile(r"\$\{REDIS_PASSWORD:-([^}]+)\}")
DEFAULT = re.compile(r"\$\{(\w+):-([^}]+)\}")


def role_password_variable(role: str) -> str:
    return f"REDIS_{role.upper()}_PASSWORD"


def test_redis_requires_the_password_every_client_sends(compose: dict[str, Any]) -> None:
    """Both Redis servers require REDIS_PASSWORD, and the broker Redis a password per role
    user, given in a config file written from the environment (no command line holds them:
    `ps` shows command lines to every user); their healthchecks authenticate; every Redis URL
    the Trainyard services get carries its role's user and password (the parameter-server
    Redis: the default user's)."""
    services = compose["services"]
    defaults = set()
    for name in ("redis", "redis-ps"):
        command = " ".join(services[name]["command"])
        assert "requirepass" in command, f"{name} runs without a password"
        assert "--requirepass" not in command and "${" not in command, (
            f"{name}: the password is on a command line"
        )
        # The shell writes the config from its environment ($$: no compose interpolation).
        assert "printf 'requirepass %s\\n" in command and "> /data/password.conf" in command
        assert "redis-server /data/password.conf" in command
        assert "umask 077" in command  # the config file is the server user's alone
        environment = services[name]["environment"]
        found = REDIS_PASSWORD.fullmatch(environment["REDIS_PASSWORD"])
        assert found, f"{name}: the password must come from REDIS_PASSWORD"
        defaults.add(found[1])
        # redis-cli reads REDISCLI_AUTH; the check greps for PONG (NOAUTH is an error reply).
        assert environment["REDISCLI_AUTH"] == environment["REDIS_PASSWORD"]
        assert "grep -q PONG" in " ".join(services[name]["healthcheck"]["test"])
    role_defaults = {}
    for role in ROLES:
        found = DEFAULT.fullmatch(services["redis"]["environment"][role_password_variable(role)])
        assert found and found[1] == role_password_variable(role)
        role_defaults[role] = found[2]
    service_roles = {"api": "api", "scheduler": "scheduler", "node": "agent"}
    for name, role in service_roles.items():
        env = services[name]["environment"]
        user = Keys().role_user(role)
        auth = re.fullmatch(rf"redis://{user}:(\$\{{[^}}]+\}})@redis:6379/0", env["REDIS_URL"])
        assert auth, f"{name}: {env['REDIS_URL']} does not log in as {user}"
        found = DEFAULT.fullmatch(auth[1])
        assert found and found[1] == role_password_variable(role)
        assert found[2] == role_defaults[role]
        for url in env["REDIS_PS_URLS"].split(","):
            auth = re.fullmatch(r"redis://:(\$\{REDIS_PASSWORD:-[^}]+\})@redis-ps:6379/0", url)
            assert auth, f"{name}: {url} does not send REDIS_PASSWORD"
            defaults.add(REDIS_PASSWORD.fullmatch(auth[1])[1])  # type: ignore[index]
        assert not any("PASSWORD" in part for part in services[name].get("command", []))
    assert len(defaults) == 1  # one default, the same everywhere
    assert len({*defaults, *role_defaults.values()}) == 1 + len(ROLES)


def test_the_broker_redis_creates_the_role_users_of_the_contract(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    """The broker Redis's own command, run here by sh with a real redis-server: each role's
    user logs in with its password and has exactly the rules contract/keys.py gives it; the
    default user needs REDIS_PASSWORD."""
    from scheduler.cli.redis_server import free_port, redis_binary

    script = services_command(compose, "redis")
    port = free_port()
    script = script.replace("/data/", f"{tmp_path}/").replace("$$", "$")
    script = script.replace("docker-entrypoint.sh redis-server", redis_binary())
    script += f" --port {port} --bind 127.0.0.1 --dir {tmp_path} --appendonly no --save ''"
    passwords = {role_password_variable(role): f"{role}-{port}" for role in ROLES}
    env = {"PATH": "/usr/bin:/bin", "REDIS_PASSWORD": "default-secret", **passwords}
    server = subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.DEVNULL)
    try:
        admin = redis.Redis(port=port, password="default-secret")
        deadline = time.monotonic() + 10
        while True:
            try:
                admin.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.05)
        assert (tmp_path / "password.conf").stat().st_mode & 0o777 == 0o600
        keys = Keys()
        for role in ROLES:
            user = keys.role_user(role)
            password = passwords[role_password_variable(role)]
            with redis.Redis(port=port, username=user, password=password) as login:
                assert login.execute_command("ACL", "WHOAMI") == user.encode()
            # The same rules set from the contract on a user of our own: the same rights.
            admin.execute_command("ACL", "SETUSER", f"expected-{role}", *keys.role_user_rules(role))
            got, want = (
                admin.execute_command("ACL", "GETUSER", u) for u in (user, f"expected-{role}")
            )
            for field in (b"commands", b"keys", b"channels"):
                assert got[field] == want[field], (role, field)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).get("anything")
        admin.close()
    finally:
        server.terminate()
        server.wait(timeout=10)


def services_command(compose: dict[str, Any], name: str) -> str:
    command = compose["services"][name]["command"]
    assert command[:2] == ["sh", "-c"]
    return str(command[2])


def test_the_operator_is_told_to_change_the_default_passwords() -> None:
    header = (ROOT / "docker-compose.yml").read_text().split("x-agent-env")[0]
    assert "REDIS_PASSWORD=" in header and "POSTGRES_PASSWORD=" in header
    assert "defaults below are public" in header
