"""The rooms of docs/architecture.md, held against the code's imports: what each package and
each room of `scheduler/` may import (at module level, in a class, inside a function or for type
checking alone), what the client loads in a fresh interpreter, and no loop of imports anywhere.
Sizes are not rules: a hand-written file past ~600 lines only earns a warning, a reason to look
at it again."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "dsl", "workers", "scheduler", "api", "trainyard")
# What each package may import of the others, and of the folders that share them: the cluster
# harness, the scripts, the benchmarks and the tests. A test imports no benchmark: what the two
# share lives in harness/ or in the product module it measures.
ALLOWED = {
    "contract": set(),
    "dsl": set(),
    "workers": {"contract", "dsl"},
    "scheduler": {"contract", "dsl", "workers", "trainyard"},
    "api": {"contract", "dsl", "workers", "scheduler"},
    "trainyard": {"contract", "dsl"},
    "harness": {"contract", "dsl", "workers", "scheduler"},
    "scripts": set(PACKAGES),
    "bench": {*PACKAGES, "harness", "scripts"},
    "tests": {*PACKAGES, "harness", "scripts"},
}
# The rooms of scheduler/, each what one process (or one concern of it) runs, and which other
# rooms each may import. The node agent runs on machines that reach Redis alone.
ROOMS = {
    "store": set(),
    "placement": {"store"},
    "recovery": {"store", "placement"},
    "sweeps": {"store"},
    "admission": {"store", "placement", "sweeps"},
    "ingest": {"store", "recovery"},
    "celery_app": set(),
    "agent": {"celery_app"},
    "daemon": {"store", "placement", "recovery", "sweeps", "admission", "ingest", "celery_app"},
    "health": {"store", "placement"},
    "cli": {"store", "admission", "agent", "daemon"},
    "__main__": {"cli"},
}
# Libraries a room may not import at all.
FORBIDDEN = {
    "scheduler.agent": {"sqlalchemy", "alembic"},
    "scheduler.store": {"torch", "celery"},
    "api.routes": {"sqlalchemy", "redis"},
}
# The client: importing it, its Client or its commands loads none of these. The few client
# modules that work with torch models import torch and dsl inside the functions that need them.
CLIENT_MAY_NOT_LOAD = ("torch", "sqlalchemy", "alembic", "celery", "uvicorn", "fastapi")
CLIENT_MAY_NOT_LOAD += ("api", "scheduler", "workers")
GENERATED = {"trainyard/models.py"}
# A route parses the request, calls one plain function below HTTP and shapes its answer: the
# SQL and Redis it needs are scheduler/'s. It may pass the request's session and the Redis
# client on, never use them itself.
ROUTES = ROOT / "api" / "routes"
SESSION_CALLS = frozenset(
    {"add", "commit", "delete", "execute", "flush", "get", "get_one", "merge", "refresh"}
    | {"rollback", "scalar", "scalars", "query"}
)
LONG_FILE = 600


def _python_files() -> list[Path]:
    skip = {".venv", "node_modules", ".git", "build", "dist"}
    return sorted(p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class Runs(Enum):
    """When an import statement runs."""

    ON_IMPORT = "on import"  # at module level or in a class body
    ON_CALL = "on call"  # inside a function: a lazy import, for speed
    NEVER = "never"  # under `if TYPE_CHECKING:`: a type annotation's dependency


@dataclass(frozen=True)
class Imported:
    name: str  # absolute; `from a import b` gives a.b: the module a.b, or a's name b
    line: int
    runs: Runs


def imports_in(source: str, package: str = "") -> list[Imported]:
    """Every import in `source`, wherever it stands: module level, class bodies, functions,
    `if TYPE_CHECKING:` blocks, and `importlib.import_module`/`__import__` of a literal name.
    `package`: the package the source is in, against which relative imports resolve."""
    found: list[Imported] = []

    def absolute(module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = package.split(".")[: len(package.split(".")) - (level - 1)]
        return ".".join([*base, *([module] if module else [])])

    def type_checking(test: ast.expr) -> bool:
        name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
        return name == "TYPE_CHECKING"

    def visit(node: ast.AST, runs: Runs) -> None:
        if isinstance(node, ast.Import):
            found.extend(Imported(alias.name, node.lineno, runs) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node.module, node.level)
            found.extend(Imported(f"{module}.{a.name}", node.lineno, runs) for a in node.names)
        elif isinstance(node, ast.Call) and node.args:
            func, first = node.func, node.args[0]
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
                found.append(Imported(str(first.value), node.lineno, runs))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            runs = Runs.NEVER if runs is Runs.NEVER else Runs.ON_CALL
        if isinstance(node, ast.If) and type_checking(node.test):
            for child in node.body:
                visit(child, Runs.NEVER)
            for child in node.orelse:
                visit(child, runs)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(ast.parse(source), Runs.ON_IMPORT)
    return found


@cache
def _imports_of(path: Path) -> tuple[Imported, ...]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return tuple(imports_in(path.read_text(), package))


def _imports(path: Path, *runs: Runs) -> set[str]:
    """The names `path` imports by statements that run as `runs` says (any, without `runs`)."""
    return {i.name for i in _imports_of(path) if not runs or i.runs in runs}


def wrong_packages(module: str, imports: Iterable[Imported]) -> list[str]:
    """Those of the imports of `module` that ALLOWED does not allow its top-level folder."""
    folder = module.split(".")[0]
    return [
        f"{module}:{i.line} imports {i.name} ({i.runs.value})"
        for i in imports
        if (other := i.name.split(".")[0]) in ALLOWED
        and other != folder
        and other not in ALLOWED[folder]
    ]


def wrong_rooms(module: str, imports: Iterable[Imported]) -> list[str]:
    """Those of the imports of the scheduler's `module` of rooms its room may not import."""
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else ""
    wrong = []
    for i in imports:
        names = i.name.split(".")
        other = names[1] if names[0] == "scheduler" and len(names) > 1 else ""
        if other in ROOMS and other != room and other not in ROOMS[room]:
            wrong.append(f"{module}:{i.line} ({room}) imports {i.name} ({i.runs.value})")
    return wrong


def forbidden_libraries(module: str, imports: Iterable[Imported]) -> list[str]:
    """Those of the imports of `module` of libraries FORBIDDEN to a room it is in."""
    banned = {
        library
        for prefix, libraries in FORBIDDEN.items()
        if module == prefix or module.startswith(prefix + ".")
        for library in libraries
    }
    return [
        f"{module}:{i.line} imports {i.name} ({i.runs.value})"
        for i in imports
        if i.name.split(".")[0] in banned
    ]


def _files() -> dict[str, list[Path]]:
    """The Python files of each folder ALLOWED names."""
    files: dict[str, list[Path]] = defaultdict(list)
    for path in _python_files():
        top = path.relative_to(ROOT).parts[0]
        if top in ALLOWED:
            files[top].append(path)
    return files


def _package_files() -> dict[str, list[Path]]:
    files = _files()
    return {package: files[package] for package in PACKAGES}


def _room(path: Path) -> str:
    """The room of scheduler/ a file is in: its sub-package, or its own name at the top."""
    parts = path.relative_to(ROOT / "scheduler").parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_package_imports_only_what_the_layering_allows(folder: str) -> None:
    files = _files()[folder]
    assert files, f"{folder}: no files"
    wrong = [w for p in files for w in wrong_packages(_module_name(p), _imports_of(p))]
    assert not wrong, "\n".join(sorted(wrong))


def test_each_room_of_the_scheduler_imports_only_the_rooms_it_may() -> None:
    rooms = {_room(path) for path in _package_files()["scheduler"]} - {"__init__"}
    assert rooms == set(ROOMS), "a room was added or removed: say in ROOMS what it may import"
    wrong = [
        w
        for path in _package_files()["scheduler"]
        for w in wrong_rooms(_module_name(path), _imports_of(path))
    ]
    assert not wrong, "\n".join(sorted(wrong))


@pytest.mark.parametrize("prefix", sorted(FORBIDDEN))
def test_a_room_does_not_import_the_libraries_it_must_not(prefix: str) -> None:
    files = sorted((ROOT / Path(*prefix.split("."))).rglob("*.py"))
    assert files, f"{prefix}: no files"
    wrong = [w for p in files for w in forbidden_libraries(_module_name(p), _imports_of(p))]
    assert not wrong, "\n".join(sorted(wrong))


# A forbidden import in every place an import statement can stand; each must be reported.
HIDDEN_IMPORTS = """
from typing import TYPE_CHECKING
import typing

if TYPE_CHECKING:
    from {target} import A

if typing.TYPE_CHECKING:
    import {target}.b
else:
    import {target}.c


class Holder:
    import {target}.d

    def method(self):
        from {target}.e import E

        def inner():
            import {target}.f
        return lambda: __import__("{target}.g")


async def fetch():
    with open("x"):
        try:
            from {target} import h
        except ImportError:
            import {target}.i


def load():
    import importlib

    return importlib.import_module("{target}.j")
"""
HIDDEN_LINES = {6, 9, 11, 15, 18, 21, 22, 28, 30, 36}


@pytest.mark.parametrize(
    ("check", "module", "target"),
    [
        (wrong_packages, "dsl.hidden", "scheduler"),
        (wrong_packages, "tests.test_hidden", "bench.load"),
        (wrong_packages, "workers.hidden", "harness"),
        (wrong_rooms, "scheduler.store.hidden", "scheduler.daemon"),
        (forbidden_libraries, "scheduler.agent.hidden", "sqlalchemy"),
    ],
)
def test_the_checks_see_imports_wherever_they_stand(
    check: Callable[[str, Iterable[Imported]], list[str]], module: str, target: str
) -> None:
    """Lazy imports are fine for speed, type-only ones for annotations; all obey the rules."""
    source = HIDDEN_IMPORTS.format(target=target)
    reported = check(module, imports_in(source, module.rpartition(".")[0]))
    lines = {int(line.split(":")[1].split()[0]) for line in reported}
    assert lines == HIDDEN_LINES, reported
    assert not check(module, imports_in(source.replace(target, "json")))


def test_imports_say_when_they_run() -> None:
    found = {i.line: i.runs for i in imports_in(HIDDEN_IMPORTS.format(target="x"))}
    assert found[6] == found[9] == Runs.NEVER
    assert found[11] == found[15] == Runs.ON_IMPORT
    assert found[18] == found[21] == found[22] == found[28] == found[36] == Runs.ON_CALL
    relative = imports_in("from ..store import jobs\nfrom . import x", "scheduler.daemon")
    assert {i.name for i in relative} >= {"scheduler.store.jobs", "scheduler.daemon.x"}


def _session_and_redis_calls(path: Path) -> tuple[list[str], int]:
    """Calls of a session's or a Redis client's methods in `path` (`session.commit()`,
    `services.redis.get(...)`), and how many times `session` is passed on as an argument."""
    calls, passed = [], 0
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        passed += sum(isinstance(arg, ast.Name) and arg.id == "session" for arg in node.args)
        if not isinstance(node.func, ast.Attribute):
            continue
        target, method = node.func.value, node.func.attr
        if isinstance(target, ast.Name) and target.id == "session" and method in SESSION_CALLS:
            calls.append(f"{path.relative_to(ROOT)}:{node.lineno} session.{method}()")
        if isinstance(target, ast.Attribute) and target.attr == "redis":
            calls.append(f"{path.relative_to(ROOT)}:{node.lineno} redis.{method}()")
    return calls, passed


def test_routes_run_no_sql_statement_nor_redis_command() -> None:
    found = [_session_and_redis_calls(path) for path in sorted(ROUTES.glob("*.py"))]
    wrong = [call for calls, _ in found for call in calls]
    assert not wrong, "\n".join(wrong)
    # A walker that saw no call would pass everything: the routes do pass their session on.
    assert sum(passed for _, passed in found) > 10


def _no_cycle(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, set())):
            if state.get(dep) == 1:
                cycle = [*stack[stack.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_allowed_graphs_have_no_cycle() -> None:
    _no_cycle(ALLOWED)
    _no_cycle(ROOMS)


def _module_graph(counts: Callable[[Imported], bool]) -> dict[str, set[str]]:
    """Each module of the packages and the harness -> those it imports by the imports that
    `counts`."""
    files = _files()
    modules = {_module_name(p): p for top in (*PACKAGES, "harness") for p in files[top]}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for imported in _imports_of(path):
            if not counts(imported):
                continue
            # `from a.b import c` names a.b.c: a submodule if there is one, else a.b's attribute.
            target = imported.name
            target = target if target in modules else target.rpartition(".")[0]
            if target in modules and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def test_no_import_cycle_between_modules() -> None:
    """Counting the imports that run, lazy ones too: a lazy import that closes a loop hides
    it, it does not break it. An import for type checking alone never runs."""
    _no_cycle(_module_graph(lambda i: i.runs is not Runs.NEVER))


def test_the_client_is_layered_without_a_loop() -> None:
    """The transport, below the resources (jobs, sweeps, uploads, ...), below the client, below
    loading and the commands: no loop among the client's modules, counting even the imports
    for type checking alone, but a resource's of the Client that made it (a Job keeps its
    Client, and says so to its users)."""

    def counts(i: Imported) -> bool:
        return i.name.startswith("trainyard") and not (
            i.runs is Runs.NEVER and i.name == "trainyard.client.Client"
        )

    graph = _module_graph(counts)
    client = {name: deps for name, deps in graph.items() if name.split(".")[0] == "trainyard"}
    assert {"trainyard.transport", "trainyard.jobs"} <= client["trainyard.client"]
    _no_cycle(client)


def _loaded_by(code: str) -> list[str]:
    """The modules loaded by running `code` in a fresh interpreter."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "code",
    [
        "import trainyard; trainyard.Client; trainyard.__version__",
        "from trainyard import Client, Job, Sweep, JobSpecRejected",
        # The client's commands: `trainyard jobs`, `submit`, `logs`... start fast.
        "from trainyard.cli import app",
    ],
)
def test_the_client_loads_neither_torch_nor_the_server(code: str) -> None:
    loaded = _loaded_by(code)
    heavy = [name for name in loaded if name.split(".")[0] in CLIENT_MAY_NOT_LOAD]
    assert not heavy, f"{code!r} loads {heavy}"


def test_the_recovery_policy_is_pure() -> None:
    """Its decisions come from plain facts: importing it loads no SQL, nor anything of the
    scheduler but the states it decides between."""
    loaded = _loaded_by("import scheduler.recovery.policy")
    assert not [n for n in loaded if n.split(".")[0] in ("sqlalchemy", "alembic", "celery")]
    ours = {n for n in loaded if n.startswith("scheduler.")}
    assert ours == {"scheduler.recovery", "scheduler.recovery.policy", "scheduler.store"} | {
        "scheduler.store.states"
    }


def test_the_installed_command_starts_without_the_server_or_torch() -> None:
    """`trainyard` (scheduler/cli/main.py) holds the server's commands too: their work, and
    the local commands' torch, wait inside their bodies."""
    loaded = _loaded_by("import scheduler.cli.main")
    entry = {"scheduler", "scheduler.cli", "scheduler.cli.main"}
    entry |= {"scheduler.cli.local", "scheduler.cli.admin"}
    heavy = [n for n in loaded if n.split(".")[0] in CLIENT_MAY_NOT_LOAD and n not in entry]
    assert not heavy, f"importing the command loads {heavy}"


def test_the_client_modules_import_torch_only_when_used() -> None:
    """At module level no client module imports torch or the server's libraries; one that
    works with torch models imports torch inside the functions that need it."""
    wrong = sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _package_files()["trainyard"]
        for name in _imports(path, Runs.ON_IMPORT)
        if name.split(".")[0] in CLIENT_MAY_NOT_LOAD
    )
    assert not wrong, "\n".join(wrong)


def test_trainyard_version_is_printed() -> None:
    import trainyard

    done = subprocess.run(
        [sys.executable, "-m", "scheduler", "--version"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"trainyard {trainyard.__version__}"
    assert trainyard.__version__[0].isdigit()


def test_long_hand_written_files_are_only_flagged() -> None:
    """Concepts are guarded above; a long file is worth a second look, not a failure."""
    files = [p for p in _python_files() if str(p.relative_to(ROOT)) not in GENERATED]
    assert len(files) > 100
    for path in files:
        lines = len(path.read_text().splitlines())
        if lines > LONG_FILE:
            warnings.warn(
                f"{path.relative_to(ROOT)} has {lines} lines (over {LONG_FILE}): does it hold "
                "one concept?",
                stacklevel=1,
            )


def test_the_checks_see_the_code() -> None:
    # A walker that found no files or no imports would pass everything above.
    files = _package_files()
    assert all(files[p] for p in PACKAGES), {p: len(files[p]) for p in PACKAGES}
    assert "dsl.layers.base.LAYERS" in _imports(ROOT / "dsl" / "schema.py", Runs.ON_IMPORT)
    agent = ROOT / "scheduler" / "agent" / "node_agent.py"
    assert "contract.allocation.AllocationState" in _imports(agent)
    # The lazy imports are seen: the client's torch, the command's server.
    assert "torch" in _imports(ROOT / "trainyard" / "predicting.py", Runs.ON_CALL)
    main = ROOT / "scheduler" / "cli" / "main.py"
    assert "scheduler.cli.stack.Stack" in _imports(main, Runs.ON_CALL)


def test_test_modules_have_names_of_their_own() -> None:
    """pytest imports test modules by their file name (the test folders are not packages), so
    two files of one name in different folders stop the whole run at collection."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in names.items() if len(paths) > 1}


# Where the frameworks and the run kinds are named: their registries (dsl/frameworks.py,
# dsl/run_kinds.py), and migrations, which write out the names as they were when they ran.
NAMED_HERE = {ROOT / "dsl" / "frameworks.py", ROOT / "dsl" / "run_kinds.py"}
MIGRATIONS = ROOT / "scheduler" / "store" / "migrations"
# The framework a prediction run once had, before it was a run kind: a reader asks the kind.
RETIRED_NAMES = {"predict"}


def _names_compared(source: str, names: set[str]) -> list[tuple[int, str]]:
    """The comparisons in `source` (==, !=, in, not in, is) of a value with one of `names`
    written as a string (`framework == "localsgd"`, `kind in ("prediction", ...)`): their lines
    and the names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        literals = {
            item.value
            for operand in (node.left, *node.comparators)
            for item in (
                operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
            )
            if isinstance(item, ast.Constant) and isinstance(item.value, str)
        }
        found += [(node.lineno, name) for name in sorted(literals & names)]
    return found


def test_no_framework_or_run_kind_is_told_by_its_name_outside_its_registry() -> None:
    """A reader asks a framework's or a run kind's descriptor (`averages_locally`,
    `scores_rows`, `restarts_alone`...), never compares its name: a new framework or kind is
    one descriptor, not a hunt for string checks."""
    from dsl.frameworks import FRAMEWORK_SPECS
    from dsl.run_kinds import RUN_KINDS

    names = {*FRAMEWORK_SPECS.names(), *RUN_KINDS.names(), *RETIRED_NAMES}
    wrong = [
        f"{path.relative_to(ROOT)}:{line} compares '{name}'"
        for paths in _package_files().values()
        for path in paths
        if path not in NAMED_HERE and MIGRATIONS not in path.parents
        for line, name in _names_compared(path.read_text(), names)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_name_scan_finds_a_name_compared_as_a_string() -> None:
    source = (
        "def f(t, k):\n"
        "    if t.framework == 'localsgd':\n"
        "        return 1\n"
        "    return k in ('prediction', 'other') or t != 'local2' or {'local': 1}\n"
    )
    names = {"localsgd", "prediction", "local"}
    assert _names_compared(source, names) == [(2, "localsgd"), (4, "prediction")]
