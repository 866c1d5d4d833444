"""Job documents built from YAML's own grammar, sent through the HTTP path: no 5xx.

tests/api/test_bad_input.py fuzzes the documents' values as Python objects, which PyYAML then
writes out tamely. Here the text itself is generated: numbers of any size and base (a
5,000-digit integer, `0x1F`, `1_000`, `190:20:30`, `.nan`), timestamps with impossible dates
(`2024-13-45`), anchors, aliases (undefined ones too) and merge keys, tags (`!!binary`,
`!!python/object`, `!!timestamp "x"`), unicode and escapes (`"\\0"`, `"\\ud800"`), flow
nesting past the parser's limit, several documents, complex keys. They go into the examples
(a value replaced, a key added, an anchor here and its alias there) or make whole documents,
and are posted to POST /jobs/validate and POST /jobs, as YAML and inside JSON, as a user,
on SQLite and PostgreSQL (the `api` fixture). Each answer must be 2xx, or a 4xx JSON error
with located issues that changed nothing (`check`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.settings import Settings
from tests.api.test_bad_input import EXAMPLES, post_both_ways

# Cases per test and database: 2 tests x 2 databases x 50 cases x 4 requests (about 10 s).
CASES = 50
FUZZ = settings(
    max_examples=CASES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

digits = st.text("0123456789", min_size=1, max_size=30)
# Python's int() refuses strings of more than 4,300 digits; small draws never reach that.
huge = st.tuples(st.sampled_from(["", "-", "+"]), st.integers(4000, 6000)).map(
    lambda p: p[0] + "7" * p[1]
)
numbers = st.one_of(
    huge,
    digits,
    st.tuples(st.sampled_from(["-", "+"]), digits).map("".join),
    st.integers().map(str),
    st.floats().map(repr),
    st.sampled_from(
        [
            ".inf",
            "-.inf",
            ".nan",
            "1e999",
            "-1e-999",
            "0x1F",
            "0o17",
            "0b101",
            "1_000",
            "685_230.15",
            "190:20:30",
            "1:2:3:4",
            "0.",
            "-0",
            "00012",
            "0x",
            "1e",
            "+.5",
        ]
    ),
)


def _timestamp(parts: tuple[int, int, int, str, str]) -> str:
    year, month, day, sep, clock = parts
    return f"{year:04d}-{month:02d}-{day:02d}{sep}{clock}"


timestamps = st.tuples(
    st.integers(0, 99999),
    st.integers(0, 99),
    st.integers(0, 99),
    st.sampled_from(["", " ", "t", "T"]),
    st.sampled_from(
        ["", "12:00:00", "25:61:61", "21:59:43.10-05:00", "1:2:3.123456789Z", "00:00:00+99:99"]
    ),
).map(_timestamp)
escapes = st.sampled_from(
    [
        '"\\0"',
        '"a\\0b"',
        '"\\ud800"',
        '"\\udfff\\ud800"',
        '"\\U0010FFFF"',
        '"\\U00110000"',
        '"\\x00"',
        '"\\N\\_\\L\\P"',
        '"\\e"',
        "'it''s'",
        '""',
        "''",
    ]
)
unicode_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
)
words = st.sampled_from(["yes", "no", "on", "off", "~", "null", "Null", "true", "FALSE", "="])
scalars = st.one_of(
    numbers,
    timestamps,
    escapes,
    words,
    unicode_text.map(json.dumps),  # double-quoted, \\u escapes included
    unicode_text,  # plain: may well break the syntax, which must be a 422 too
)
tags = st.sampled_from(
    [
        "!!str",
        "!!int",
        "!!float",
        "!!bool",
        "!!null",
        "!!timestamp",
        "!!binary",
        "!!set",
        "!!omap",
        "!!pairs",
        "!!map",
        "!!seq",
        "!!merge",
        "!!value",
        "!!python/object:os.system",
        "!!python/name:os.system",
        "!custom",
        "!",
        "!<tag:yaml.org,2002:int>",
        "!<!>",
    ]
)
tagged = st.tuples(tags, scalars).map(" ".join)
anchors = st.sampled_from(["a", "b", "x"])


def _flow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    items = st.lists(children, max_size=4)
    return st.one_of(
        items.map(lambda values: "[" + ", ".join(values) + "]"),
        st.lists(
            st.tuples(st.one_of(words, numbers, unicode_text.map(json.dumps)), children), max_size=4
        ).map(lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"),
        st.tuples(anchors, children).map(lambda p: f"&{p[0]} {p[1]}"),
    )


values = st.recursive(
    st.one_of(scalars, tagged, anchors.map(lambda name: f"*{name}")), _flow, max_leaves=10
)
deep = st.integers(1, 150).map(lambda n: "[" * n + "1" + "]" * n)
# What Python or the database cannot hold, drawn as often as the grammar's whole range.
hostile = st.one_of(huge, timestamps, tagged, escapes)
fragments = st.one_of(
    hostile, values, st.one_of(deep, st.sampled_from(["*undefined", "{<<: *a}", "&a"]))
)

INLINE = re.compile(r"^(\s*(?:- )?)([A-Za-z_][\w-]*): (\S.*)$")


@st.composite
def mutated_text(draw: st.DrawFn) -> str:
    """An example's text with a few edits of its own lines: values replaced by fragments, an
    anchor put on one value and its alias on another, keys added at the top."""
    lines = EXAMPLES[draw(st.sampled_from(sorted(EXAMPLES)))].splitlines()
    inline = [i for i, line in enumerate(lines) if INLINE.match(line)]
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(inline))
        indent, key, value = INLINE.match(lines[where]).groups()  # type: ignore[union-attr]
        action = draw(st.sampled_from(["replace", "anchor", "add"]))
        if action == "replace":
            lines[where] = f"{indent}{key}: {draw(fragments)}"
        elif action == "anchor":
            other = draw(st.sampled_from(inline))
            lines[where] = f"{indent}{key}: &shared {value}"
            match = INLINE.match(lines[other])
            if match and other != where:
                lines[other] = f"{match.group(1)}{match.group(2)}: *shared"
        else:
            lines.append(
                f"{draw(st.sampled_from(['seed', 'name', 'zzz', 'train_steps', '<<']))}: "
                f"{draw(fragments)}"
            )
    text = "\n".join(lines) + "\n"
    if draw(st.booleans()):
        text = draw(st.sampled_from(["", "%YAML 1.1\n---\n", "--- !!map\n", "---\n"])) + text
    if draw(st.integers(0, 5)) == 0:
        text += "---\nname: second\n"
    return text


whole = st.lists(
    st.tuples(st.one_of(words, unicode_text, st.just("? [a, b]\n"), numbers), fragments),
    min_size=1,
    max_size=6,
).map(lambda pairs: "".join(f"{k}: {v}\n" for k, v in pairs))


@pytest.fixture
def api_settings(api_settings: Settings) -> Settings:
    return api_settings.model_copy(update={"quota_submissions_per_minute": None})


@FUZZ
@given(text=mutated_text())
def test_mutated_example_texts_never_500(api: Any, text: str) -> None:
    post_both_ways(api, text, "/api/v1/jobs/validate")
    post_both_ways(api, text, "/api/v1/jobs")


@FUZZ
@given(text=whole)
def test_documents_from_the_yaml_grammar_never_500(api: Any, text: str) -> None:
    post_both_ways(api, text, "/api/v1/jobs/validate")
    post_both_ways(api, text, "/api/v1/jobs")


def test_an_error_quoting_a_lone_surrogate_is_escaped_json(api: Any) -> None:
    """The fuzzer's find: a key written as "\\ud800" (a lone surrogate) quoted in a 422's
    message could not be encoded as UTF-8 and gave a 500. libyaml's parser refuses the escape
    itself now, at its line (a JSON body's lone surrogate is refused as not a string)."""
    text = 'train_steps: 10\ntrain_steps: {"\\ud800x": 2026-01-01 00:00:00 +99:00}\n'
    answer = api.client.post(
        "/api/v1/jobs/validate",
        content=text.encode("utf-8"),
        headers=api.yaml_headers(),
    )
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["line"] == 2 and "escape" in answer.json()["detail"]
