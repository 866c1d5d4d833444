"""Every Redis key and time-to-live is defined in contract/keys.py alone, under the stack's
prefix."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from contract.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
SOURCE_PACKAGES = ("api", "bench", "dsl", "scheduler", "scripts", "trainyard", "workers")


def test_every_key_lives_under_the_prefix() -> None:
    keys = Keys("stack-a")
    names = [
        keys.job_stream(1),
        keys.cancel(1),
        keys.streams_with_data,
        keys.ingested_points,
        keys.allocation(2),
        keys.node("n"),
        keys.nodes,
        keys.ps_pattern(1),
        keys.announcements,
        keys.pattern,
    ]
    assert all(name.startswith("stack-a:") for name in names)
    assert len(set(names)) == len(names)
    assert keys.job_stream(1) == "stack-a:job:1:stream"  # stored streams are found by this
    assert re.fullmatch(keys.pattern.replace("*", ".*"), keys.ps_pattern(1))


def source_files() -> list[Path]:
    files = [path for package in SOURCE_PACKAGES for path in (ROOT / package).rglob("*.py")]
    assert len(files) > 50, "the source tree was not found"
    return files


def test_time_to_lives_are_defined_only_in_contract() -> None:
    defined = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for target in targets:
                if isinstance(target, ast.Name) and target.id.endswith("_TTL_SECONDS"):
                    defined.append(f"{path.relative_to(ROOT)}:{node.lineno} {target.id}")
    assert defined == []


def test_key_names_are_spelled_only_in_contract() -> None:
    """No f-string outside contract builds a key from the stack's prefix (use Keys)."""
    spelled = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.JoinedStr) and re.search(
                r"\{[\w.]*prefix\}:", ast.unparse(node)
            ):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert spelled == []
