"""Located errors: the user interface of the job language.

Every failure while reading, validating or compiling a job is a `SpecIssue` that points at the
YAML path and the line:column in the user's file, says what was expected and gives a hint.
Several issues travel together in one `JobSpecError` so a user fixes them in one pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

PathPart = str | int
Path = tuple[PathPart, ...]


def format_path(path: Path) -> str:
    """`("neuralnet", "layers", 2, "filters")` -> `neuralnet.layers[2].filters`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<document>"


@dataclass(frozen=True)
class SpecIssue:
    path: str
    message: str
    line: int | None = None
    column: int | None = None
    hint: str | None = None

    def where(self) -> str:
        if self.line is None:
            return self.path
        return f"{self.path} (line {self.line}, column {self.column})"

    def __str__(self) -> str:
        text = f"{self.where()}: {self.message}"
        return f"{text}\n    hint: {self.hint}" if self.hint else text

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class JobSpecError(Exception):
    """One or more located problems with a job document."""

    issues: list[SpecIssue] = field(default_factory=list)

    def __init__(self, issues: Iterable[SpecIssue] | SpecIssue) -> None:
        self.issues = [issues] if isinstance(issues, SpecIssue) else list(issues)
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.issues)
        head = f"{count} problem{'s' if count != 1 else ''} in the job"
        return head + ":\n" + "\n".join(f"  - {issue}" for issue in self.issues)

    def to_list(self) -> list[dict[str, object]]:
        return [issue.to_dict() for issue in self.issues]


class DataSourceError(ValueError):
    """The data cannot be loaded as configured; the compiler reports it at `data.<field>`."""

    def __init__(self, message: str, hint: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint, self.field = message, hint, field
