"""Hypothesis on the job language: random and mutated documents, grown from the examples, give
a compiled job or a JobSpecError whose every issue is located; never another exception.

Mutations act on the parsed tree (delete, rename, retype or replace a key's value, insert
keys, shuffle list items) and on the text itself (cut, repeat, insert characters), so both the
YAML reader and the validation and build stages behind it are reached.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsl.compiler import compile_job
from dsl.errors import JobSpecError
from dsl.layers.base import BuildContext
from dsl.schema import JobSpec
from workers.data import describe

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {path.name: path.read_text() for path in sorted((ROOT / "examples").glob("*.yaml"))}
TREES = {name: yaml.safe_load(text) for name, text in EXAMPLES.items()}
# Kept modest so the file runs in well under a minute on a busy 2-core machine.
EXAMPLES_PER_TEST = 250

SCALARS = st.one_of(
    st.sampled_from(
        [0, -1, 1, 2, 3, 7, 64, 10**6, 10**12, 2**63, 0.5, -2.5, 1e308, math.inf, math.nan]
    ),
    st.sampled_from([True, False, None, "", "x", "data", "fc1", "../x", "/etc/passwd", "1e3"]),
    st.text(max_size=8),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(tree: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a node of the tree (the root is ())."""
    out = [prefix]
    if isinstance(tree, dict):
        for key, value in tree.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            out += _paths(value, (*prefix, index))
    return out


def _parent(tree: Any, path: tuple[Any, ...]) -> Any:
    node = tree
    for part in path[:-1]:
        node = node[part]
    return node


@st.composite
def mutated_tree(draw: st.DrawFn) -> Any:
    tree = yaml.safe_load(yaml.safe_dump(TREES[draw(st.sampled_from(sorted(TREES)))]))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(tree) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(tree, path), path[-1]
        actions = ["replace", "delete", "rename", "insert", "wrap", "swap", "extreme"]
        action = draw(st.sampled_from(actions))
        if action == "extreme" and isinstance(parent[key], int | float):
            # Numbers where they are expected, at the edges: sizes, rates, counts.
            parent[key] = draw(st.sampled_from([0, -1, 10**5, 10**9, 10**12, 2**63, -0.0]))
        elif action == "replace":
            parent[key] = draw(VALUES)
        elif action == "delete":
            del parent[key]
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8)) + str(key)[1:]] = parent.pop(key)
        elif action == "insert" and isinstance(parent, dict):
            parent[draw(st.sampled_from([*parent, "type", "srclayers", "units", "extra"]))] = draw(
                VALUES
            )
        elif action == "wrap":
            parent[key] = draw(st.sampled_from([[parent[key]], {"value": parent[key]}]))
        elif action == "swap" and isinstance(parent, list) and len(parent) > 1:
            other = draw(st.integers(0, len(parent) - 1))
            parent[key], parent[other] = parent[other], parent[key]
    return tree


@st.composite
def mutated_text(draw: st.DrawFn) -> str:
    text = EXAMPLES[draw(st.sampled_from(sorted(EXAMPLES)))]
    for _ in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 40)))
        action = draw(st.sampled_from(["cut", "repeat", "insert"]))
        if action == "cut":
            text = text[:start] + text[end:]
        elif action == "repeat":
            text = text[:end] + text[start:end] + text[end:]
        else:
            text = text[:start] + draw(st.text(max_size=6)) + text[start:]
    return text


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], None]:
    cache = tmp_path_factory.mktemp("fuzz-cache")
    base = tmp_path_factory.mktemp("fuzz-base")

    def data(spec: JobSpec) -> BuildContext:
        info = describe(spec.data, seed=spec.seed, cache_dir=cache, base_dir=base)
        return info.build_context()

    def compile_or_locate(document: str) -> None:
        try:
            compile_job(document, data, filename="fuzz.yaml")
        except JobSpecError as error:
            assert error.issues
            for issue in error.issues:
                assert issue.path and issue.message, issue
                assert issue.line is None or (issue.line >= 1 and (issue.column or 0) >= 1)

    return compile_or_locate


FUZZ = settings(
    max_examples=EXAMPLES_PER_TEST,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # the same documents on every run: a failure here reproduces
)


@FUZZ
@given(tree=mutated_tree())
@pytest.mark.slow  # hundreds of documents compiled
def test_mutated_documents_give_located_errors(check: Callable[[str], None], tree: Any) -> None:
    check(yaml.safe_dump(tree, sort_keys=False, allow_unicode=True))


@FUZZ
@given(text=mutated_text())
@pytest.mark.slow  # hundreds of documents compiled
def test_mutated_text_gives_located_errors(check: Callable[[str], None], text: str) -> None:
    check(text)


@FUZZ
@given(value=VALUES)
def test_random_documents_give_located_errors(check: Callable[[str], None], value: Any) -> None:
    check(yaml.safe_dump(value, allow_unicode=True))


@pytest.mark.parametrize(
    ("units", "message"),
    [
        (10**9, "parameters take the net past the limit of 1,000,000,000"),
        (10**11, "parameters take the net past the limit"),
        (2**63, "cannot be built with these sizes"),  # past torch's 64-bit sizes
    ],
)
def test_layers_too_large_to_build_are_located_not_allocated(
    check: Callable[[str], None], units: int, message: str
) -> None:
    """What the fuzzer found first: `units: 100000000000` made torch try to allocate 400 GB
    (a RuntimeError, a 500 from the API); now it is counted on the meta device and refused."""
    document = EXAMPLES["digits_mlp.yaml"].replace("units: 256", f"units: {units}", 1)
    with pytest.raises(JobSpecError) as refused:
        compile_job(document, BuildContext(sample_shape=(64,), num_classes=10))
    (issue,) = refused.value.issues
    assert issue.path == "neuralnet.layers[1]" and issue.line == 9
    assert "layer 'fc1' (innerproduct)" in issue.message and message in issue.message
