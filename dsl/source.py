"""Read a job document with the position of every key and value.

PyYAML's composer (libyaml's, where PyYAML was built with it: several times faster) gives each
node its line and column; we build plain Python values (safe types only: no tags, no Python
objects) and remember where each path came from, so that every later error can point at the
user's file. A document is refused before the composer runs where it nests brackets too deep
or holds too many nodes for its parse to cost little.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from dsl.errors import JobSpecError, Path, SpecIssue, format_path

Position = tuple[int, int]  # 1-based line, column
# libyaml's parser where PyYAML has it (its wheels do), else PyYAML's own: the same nodes.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class SourceMap:
    """Where each path of the document stands in the file (keys and values)."""

    filename: str = "<job>"
    values: dict[Path, Position] = field(default_factory=dict)
    keys: dict[Path, Position] = field(default_factory=dict)
    # Paths of the compiled job that stand elsewhere in the document: an expanded layer of a
    # repeated block (its layer in the block), a block named in a pipeline stage.
    aliases: dict[Path, Path] = field(default_factory=dict)

    def aliased(self, aliases: dict[Path, Path]) -> SourceMap:
        """This map, reading `aliases` (a path prefix -> the prefix where it was written)."""
        return replace(self, aliases={**self.aliases, **aliases})

    def written(self, path: Path) -> Path:
        """Where `path` stands in the document: its longest aliased prefix replaced."""
        path = tuple(path)
        for end in range(len(path), 0, -1):
            origin = self.aliases.get(path[:end])
            if origin is not None:
                return (*origin, *path[end:])
        return path

    def locate(self, path: Path) -> Position | None:
        """The key's position if the path names a key, else its value's, else its parent's."""
        return self._position(self.written(path))

    def _position(self, probe: Path) -> Position | None:
        while True:
            if probe in self.keys:
                return self.keys[probe]
            if probe in self.values:
                return self.values[probe]
            if not probe:
                return None
            probe = probe[:-1]

    def issue(self, path: Path, message: str, hint: str | None = None) -> SpecIssue:
        path = self.written(path)
        pos = self._position(path)
        line, column = pos if pos else (None, None)
        return SpecIssue(format_path(path), message, line, column, hint)


_PLAIN_TAGS = {
    f"tag:yaml.org,2002:{name}"
    for name in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq")
}


def _pos(node: Node) -> Position:
    return node.start_mark.line + 1, node.start_mark.column + 1


# Aliases let a few lines expand to billions of values ("billion laughs"); a job has hundreds.
MAX_VALUES = 100_000


class _Builder:
    def __init__(self, source: SourceMap) -> None:
        self.source = source
        self.scalars = SafeConstructor()
        self.issues: list[SpecIssue] = []
        self.count = 0

    def build(self, node: Node, path: Path) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise JobSpecError(
                SpecIssue(
                    "<document>",
                    f"the document expands to more than {MAX_VALUES:,} values",
                    hint="a job holds a few hundred; check YAML aliases (*name) that repeat "
                    "large parts",
                )
            )
        self.source.values[path] = _pos(node)
        if node.tag not in _PLAIN_TAGS:
            self.issues.append(
                self.source.issue(
                    path,
                    f"YAML tag '{node.tag}' is not allowed",
                    hint="job files hold plain values only; remove the tag",
                )
            )
            return None
        if isinstance(node, MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag not in _PLAIN_TAGS:
                    self.issues.append(
                        self.source.issue(path, "a key must be a plain name, not a collection")
                    )
                    continue
                key = self._scalar(key_node, path)
                if not isinstance(key, str | int | float | bool) or key is None:
                    key = str(key)
                child = (*path, key if isinstance(key, str) else str(key))
                if key in out:
                    line, _ = _pos(key_node)
                    self.source.keys.setdefault(child, _pos(key_node))
                    self.issues.append(
                        self.source.issue(
                            child,
                            f"key '{key}' appears twice in this mapping (again on line {line})",
                            hint="remove one of them; YAML keeps only the last",
                        )
                    )
                self.source.keys[child] = _pos(key_node)
                out[key] = self.build(value_node, child)
            return out
        if isinstance(node, SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._scalar(node, path)

    def _scalar(self, node: Node, path: Path) -> Any:
        # PyYAML resolves a scalar's type by its look, then converts it: `2024-13-45` looks
        # like a date and is none; an integer of more than 4,300 digits is refused by int().
        try:
            value = self.scalars.construct_object(node)
            if isinstance(value, str) and "\0" in value:  # "\0" in double quotes
                self.issues.append(
                    self.source.issue(path, "text holds a NUL character", hint="remove the \\0")
                )
                return None
            return value
        except yaml.YAMLError as exc:
            self.issues.append(self.source.issue(path, f"bad scalar value: {exc}"))
        except (ValueError, OverflowError, TypeError, AttributeError, LookupError) as exc:
            # `!!timestamp "x"`, `!!bool "x"`: PyYAML's constructors assume their own look.
            reason = (
                str(exc).split(";")[0]
                if isinstance(exc, ValueError | OverflowError)
                else f"'{str(node.value)[:40]}' cannot be read as one"
            )
            self.issues.append(
                self.source.issue(
                    path,
                    f"not a valid {node.tag.rsplit(':', 1)[-1]}: {reason}",
                    hint="quote it to make it a string",
                )
            )
        return None


# PyYAML's scanner takes time quadratic in the nesting of flow collections ([[[[...), so a
# small document could hold a server for minutes; a job nests a handful of levels.
MAX_FLOW_DEPTH = 100

# Parsing costs time in proportion to the document's nodes (about 0.1 ms each, before any
# check), so a document under the request's size bound (a megabyte) could hold the server for
# seconds. The nodes are counted first, cheaply and from above: every `key:` (and JSON's
# `"key":`), every `- ` item and every `,` of a flow collection, comments and quoted text
# included. The largest example counts under 200; a net that needs more repeats a block.
MAX_DOCUMENT_NODES = 10_000
_NODE = re.compile(r"""(?m):(?=\s|$)|(?<=["']):|,|^[ \t]*-[ \t\n]""")


def _too_many_nodes(text: str) -> tuple[int, int] | None:
    """The (line, column) of the node past MAX_DOCUMENT_NODES, or None."""
    for count, match in enumerate(_NODE.finditer(text), start=1):
        if count > MAX_DOCUMENT_NODES:
            start = match.start()
            line_start = text.rfind("\n", 0, start) + 1
            return text.count("\n", 0, start) + 1, start - line_start + 1
    return None


def _too_deep(text: str) -> tuple[int, int] | None:
    """The (line, column) where [ { nesting passes MAX_FLOW_DEPTH, or None. Brackets inside
    quoted scalars and comments do not count; a quote opens a scalar only where one can start."""
    depth = 0
    for number, line in enumerate(text.splitlines(), start=1):
        quote: str | None = None
        previous = " "
        for column, char in enumerate(line, start=1):
            if quote:
                if char == quote:
                    quote = None
            elif char in "'\"" and previous in " \t[{,:-":
                quote = char
            elif char == "#" and previous in " \t":
                break
            elif char in "[{":
                depth += 1
                if depth > MAX_FLOW_DEPTH:
                    return number, column
            elif char in "]}":
                depth = max(depth - 1, 0)
            previous = char
    return None


ESCAPE_HINT = "a \\U escape names at most U+0010FFFF"
_LONG_ESCAPE = re.compile(r"\\U([0-9A-Fa-f]{8})")


def _escape_past_unicode(text: str) -> tuple[int, int] | None:
    """The (line, column) of the first \\U escape past the last code point, or None."""
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _LONG_ESCAPE.finditer(line):
            if int(match.group(1), 16) > sys.maxunicode:
                return number, match.start() + 1
    return None


@dataclass(frozen=True)
class ParsedDocument:
    """A job document parsed once, its values with their positions, for every reader of one
    submission (is it a sweep? the compile, a sweep's base job): parsing costs milliseconds."""

    raw: dict[str, Any]
    source: SourceMap


def read_document(
    document: str | Mapping[str, Any] | ParsedDocument, filename: str = "<job>"
) -> ParsedDocument:
    """YAML text parsed, a mapping as it is (its values have no positions), a parsed one kept."""
    if isinstance(document, ParsedDocument):
        return document
    if isinstance(document, str):
        return ParsedDocument(*parse_document(document, filename))
    return ParsedDocument(dict(document), SourceMap(filename))


def parse_document(text: str, filename: str = "<job>") -> tuple[dict[str, Any], SourceMap]:
    """Parse one YAML job document into plain values and their positions."""
    source = SourceMap(filename)
    crowded = _too_many_nodes(text)
    if crowded:
        raise JobSpecError(
            SpecIssue(
                "<document>",
                f"the document holds more than {MAX_DOCUMENT_NODES:,} keys, list items and "
                "flow entries; it is refused before it is read",
                *crowded,
                "a job holds a few hundred: write repeated layers once, in a block of "
                "`type: repeat`",
            )
        )
    deep = _too_deep(text)
    if deep:
        raise JobSpecError(
            SpecIssue(
                "<document>",
                f"brackets nest more than {MAX_FLOW_DEPTH} levels deep",
                *deep,
                "a job nests a few levels of [lists] and {mappings}",
            )
        )
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        problem = exc.problem or str(exc)
        hint = "check indentation, colons and quotes around this position"
        escape = _escape_past_unicode(text) if "escape" in problem else None
        if escape:  # libyaml points past the escape's digits: point at its backslash
            (line, column), hint = escape, ESCAPE_HINT
        raise JobSpecError(
            SpecIssue(
                "<document>",
                f"malformed YAML: {problem}" + (f" ({exc.context})" if exc.context else ""),
                line,
                column,
                hint,
            )
        ) from None
    except yaml.YAMLError as exc:
        raise JobSpecError(SpecIssue("<document>", f"malformed YAML: {exc}")) from None
    except ValueError as exc:  # the scanner's chr() of an escape past U+10FFFF ("\U00110000")
        line, column = _escape_past_unicode(text) or (None, None)
        raise JobSpecError(
            SpecIssue(
                "<document>",
                f"malformed YAML: {exc}",
                line,
                column,
                ESCAPE_HINT,
            )
        ) from None
    if root is None:
        raise JobSpecError(SpecIssue("<document>", "the job document is empty"))
    builder = _Builder(source)
    data = builder.build(root, ())
    if builder.issues:
        raise JobSpecError(builder.issues)
    if not isinstance(data, dict):
        raise JobSpecError(
            source.issue((), "a job must be a mapping of keys (name, data, neuralnet, ...)")
        )
    return data, source
