"""docs/operations.md's multi-machine instructions are the ones the test hosts follow
(scripts/testhosts.py): the same variables exported on each kind of host, the same commands
with the same options, and a paragraph that tells how to try them on one machine."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from scripts.testhosts import (
    HEAD_VARIABLES,
    NODE_VARIABLES,
    api_command,
    scheduler_command,
    worker_command,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
# Values each installation chooses for itself; every other value must match the doc's.
CHOSEN = {"--workers", "--name", "--slots", "--gpus"}


def across_machines() -> list[tuple[set[str], list[list[str]]]]:
    """Each shell block of the section: (the variables it exports, its trainyard commands)."""
    text = DOC.read_text()
    section = text.split("## Across machines", 1)[1].split("\n## ", 1)[0]
    blocks = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
        exported = {line.split()[1].split("=")[0] for line in lines if line.startswith("export ")}
        commands = [shlex.split(line) for line in lines if line.startswith("trainyard ")]
        if exported or commands:  # the blocks of the hosts, not the harness's own
            blocks.append((exported, commands))
    return blocks


def options(argv: list[str]) -> list[tuple[str, str | None]]:
    """(option, value) in order; values the installation chooses are left out."""
    found = []
    for index, word in enumerate(argv):
        if word.startswith("--"):
            value = argv[index + 1] if index + 1 < len(argv) else None
            found.append((word, None if word in CHOSEN else value))
    return found


def as_documented(argv: list[str]) -> list[str]:
    return ["trainyard", *argv[1:]]  # the harness runs the venv's console script by its path


def test_the_harness_exports_what_the_doc_exports_on_each_kind_of_host() -> None:
    (head_vars, _), (node_vars, _) = across_machines()
    assert head_vars == set(HEAD_VARIABLES)
    assert node_vars == set(NODE_VARIABLES)


def test_the_harness_starts_each_process_with_the_docs_command_and_options() -> None:
    (_, head), (_, node) = across_machines()
    harness_head = [as_documented(api_command()), as_documented(scheduler_command())]
    assert [c[:2] for c in head] == [c[:2] for c in harness_head]
    assert [options(c) for c in head] == [options(c) for c in harness_head]
    (worker,) = node
    harness_worker = as_documented(worker_command("node-1", 1))
    assert worker[:2] == harness_worker[:2]
    assert options(worker) == options(harness_worker)


def test_the_doc_tells_how_to_try_several_machines_on_one() -> None:
    section = DOC.read_text().split("## Across machines", 1)[1].split("\n## ", 1)[0]
    assert "scripts/testhosts.py up" in section and "pytest -m hosts" in section
