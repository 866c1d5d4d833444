"""One registry per extension point (layers, updaters, schedules, data sources, frameworks).

Filled by a decorator next to each implementation; a name registered twice raises, and an unknown
name raises with the known names and a did-you-mean.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def did_you_mean(name: str, known: list[str]) -> str | None:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None


class UnknownNameError(KeyError):
    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind, self.name, self.known = kind, name, known
        self.suggestion = did_you_mean(name, known)
        super().__init__(name)

    def __str__(self) -> str:
        text = f"unknown {self.kind} '{self.name}'; known: {', '.join(self.known)}"
        return f"{text} ({self.suggestion})" if self.suggestion else text


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        def decorate(item: T) -> T:
            for name in names:
                if name in self._items:
                    raise ValueError(f"{self.kind} '{name}' is registered twice")
                self._items[name] = item
            return item

        return decorate

    def unregister(self, name: str) -> None:
        """Forget `name` (a plugin's type, when a test unloads the plugin)."""
        del self._items[name]

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def names_as_registered(self) -> list[str]:
        """The names in the order they were registered: where users see an order of their own
        (a schema's choices and the errors that list them)."""
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())
