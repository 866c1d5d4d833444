"""The layering of docs/architecture.md, held against the code's imports and sizes."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "dsl", "workers", "scheduler", "api", "trainyard")
# What each package may import of the others (any import, at module level or in a function).
ALLOWED = {
    "contract": set(),
    "dsl": set(),
    "workers": {"contract", "dsl"},
    "scheduler": {"contract", "dsl", "workers", "trainyard"},
    "api": {"contract", "dsl", "workers", "scheduler"},
    "trainyard": {"contract", "dsl"},
}
MAX_LINES = 450
# A route parses the request, calls one plain function below HTTP and shapes its answer: the
# SQL and Redis it needs are scheduler/'s. It may pass the request's session and the Redis
# client on, never use them itself.
ROUTES = ROOT / "api" / "routes"
NOT_IN_ROUTES = ("sqlalchemy", "redis")
SESSION_CALLS = frozenset(
    {"add", "commit", "delete", "execute", "flush", "get", "get_one", "merge", "refresh"}
    | {"rollback", "scalar", "scalars", "query"}
)


def _python_files() -> list[Path]:
    skip = {".venv", "node_modules", ".git", "build", "dist"}
    return sorted(p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, module_level_only: bool) -> set[str]:
    """Absolute names `path` imports; with `module_level_only`, those run when it is imported
    (not inside functions, nor under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    if module_level_only:
        visit(tree.body)
    else:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
    return found


def _package_files() -> dict[str, list[Path]]:
    files: dict[str, list[Path]] = defaultdict(list)
    for path in _python_files():
        top = path.relative_to(ROOT).parts[0]
        if top in PACKAGES:
            files[top].append(path)
    return files


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_the_layering_allows(package: str) -> None:
    wrong = sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _package_files()[package]
        for name in _imports(path, module_level_only=False)
        if name.split(".")[0] in PACKAGES
        and name.split(".")[0] != package
        and name.split(".")[0] not in ALLOWED[package]
    )
    assert not wrong, "\n".join(wrong)


def test_routes_import_neither_sql_nor_redis() -> None:
    routes = sorted(ROUTES.glob("*.py"))
    assert routes, "no route modules found"
    wrong = sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in routes
        for name in _imports(path, module_level_only=False)
        if name.split(".")[0] in NOT_IN_ROUTES
    )
    assert not wrong, "\n".join(wrong)


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


def test_the_allowed_package_graph_has_no_cycle() -> None:
    seen: dict[str, str] = {}

    def walk(package: str) -> None:
        seen[package] = "open"
        for dep in ALLOWED[package]:
            assert seen.get(dep) != "open", f"cycle through {package} -> {dep}"
            if dep not in seen:
                walk(dep)
        seen[package] = "done"

    for package in PACKAGES:
        if package not in seen:
            walk(package)


def test_no_import_cycle_between_modules() -> None:
    modules = {_module_name(p): p for files in _package_files().values() for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for imported in _imports(path, module_level_only=True):
            # `from a.b import c` names a.b.c: a submodule if there is one, else a.b's attribute.
            target = imported if imported in modules else imported.rpartition(".")[0]
            if target in modules and target != name:
                deps.add(target)
        graph[name] = deps
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
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


def test_no_python_file_is_over_the_limit() -> None:
    long = sorted(
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in _python_files()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    )
    assert not long, "\n".join(long)


def test_the_checks_see_the_code() -> None:
    # A walker that found no files or no imports would pass everything above.
    files = _package_files()
    assert all(files[p] for p in PACKAGES), {p: len(files[p]) for p in PACKAGES}
    assert "dsl.layers.base" in _imports(ROOT / "dsl" / "schema.py", module_level_only=True)


def test_test_modules_have_names_of_their_own() -> None:
    """pytest imports test modules by their file name (the test folders are not packages), so
    two files of one name in different folders stop the whole run at collection."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in names.items() if len(paths) > 1}
