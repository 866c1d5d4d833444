"""Bad input gets a clear 4xx and changes nothing; no input produces a 500.

Property-based: random documents and mutations of the examples go to POST /jobs/validate and
POST /jobs as YAML and as JSON. Each response must be 2xx or a 4xx JSON error; a rejected
request must leave the store as it was, and an accepted submission adds exactly one job.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {path.name: path.read_text() for path in sorted((ROOT / "examples").glob("*.yaml"))}
PARSED = {name: yaml.safe_load(text) for name, text in EXAMPLES.items()}
MLP = EXAMPLES["digits_mlp.yaml"]

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "input",
            "innerproduct",
            "conv2d",
            "softmax_loss",
            "sgd",
            "adam",
            "digits",
            "mnist1d",
            "dataset",
            "npz",
            "local",
            "downpour",
            "bp",
            "cd",
            "relu",
            "x",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
keys = st.sampled_from(
    [
        "name",
        "data",
        "neuralnet",
        "layers",
        "updater",
        "train_steps",
        "cluster",
        "source",
        "type",
        "srclayers",
        "units",
        "lr",
        "base",
        "seed",
        "test",
        "checkpoint",
        "param",
        "batch_size",
        "framework",
        "nworker_groups",
        "kernel",
        "include",
        "partition_dim",
        "zzz",
    ]
)


def paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            out += paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            out += paths(value, (*prefix, index))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """An example with a few random edits: values replaced, keys dropped or added."""
    document = copy.deepcopy(PARSED[draw(st.sampled_from(sorted(PARSED)))])
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(paths(document)[1:]))
        parent = document
        for part in where[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        last = where[-1]
        if action == "replace":
            parent[last] = draw(values)
        elif action == "drop" and isinstance(parent, dict):
            del parent[last]
        elif action == "drop" and isinstance(parent, list) and len(parent) > 1:
            parent.pop(last)
        elif isinstance(parent[last], dict):
            parent[last][draw(keys)] = draw(values)
    return document


@pytest.fixture
def api_settings(api_settings: Settings) -> Settings:
    """Hypothesis submits many jobs in a minute: the rate limit has tests of its own
    (tests/api/test_quotas.py)."""
    return api_settings.model_copy(update={"quota_submissions_per_minute": None})


def check(api: Any, response: Any, before: tuple[int, int, int], submit: bool) -> None:
    assert response.status_code < 500, response.text
    assert str(api.settings.resolved_data_dir()) not in response.text  # no server path
    body = response.json()
    if response.is_success:
        grew = 1 if submit else 0
        assert api.counts() == (before[0] + grew, before[1] + grew, before[2])
        return
    # 403: a priority above the default from a user who is not an admin
    assert response.status_code in (403, 413, 415, 422), response.text
    assert isinstance(body["detail"], str) and body["detail"]
    for issue in body["errors"]:
        assert set(issue) == {"path", "line", "column", "message", "hint"}
    assert api.counts() == before


def post_both_ways(api: Any, document: Any, path: str) -> None:
    text = yaml.safe_dump(document, sort_keys=False) if not isinstance(document, str) else document
    for kwargs in (
        {"content": text.encode(), "headers": api.yaml_headers()},
        {
            "content": json.dumps({"spec": document}),
            "headers": {**api.auth(), "content-type": "application/json"},
        },
    ):
        before = api.counts()
        check(api, api.client.post(path, **kwargs), before, submit=path == "/api/v1/jobs")


@FUZZ
@given(document=mutated())
def test_mutated_examples_never_500(api: Any, document: dict[str, Any]) -> None:
    post_both_ways(api, document, "/api/v1/jobs/validate")
    post_both_ways(api, document, "/api/v1/jobs")


@FUZZ
@given(document=values | st.dictionaries(keys, values, max_size=6) | st.text(max_size=200))
def test_random_documents_never_500(api: Any, document: Any) -> None:
    post_both_ways(api, document, "/api/v1/jobs/validate")
    post_both_ways(api, document, "/api/v1/jobs")


@FUZZ
@given(
    overrides=st.dictionaries(
        st.text(max_size=30)
        | st.sampled_from(
            [
                "train_steps",
                "neuralnet.layers.fc1.units",
                "data.source",
                "cluster.framework",
                "seed",
                "neuralnet.layers.0",
                "updater.lr.base",
            ]
        ),
        values,
        max_size=3,
    ),
    priority=st.integers(min_value=-(2**40), max_value=2**40),
)
def test_random_overrides_and_priorities_never_500(
    api: Any, overrides: dict[str, Any], priority: int
) -> None:
    body = json.dumps({"spec": MLP, "overrides": overrides, "priority": priority})
    headers = {**api.auth(), "content-type": "application/json"}
    for path in ("/api/v1/jobs/validate", "/api/v1/jobs"):
        before = api.counts()
        check(
            api,
            api.client.post(path, content=body, headers=headers),
            before,
            submit=path == "/api/v1/jobs",
        )


LAYERS_18K = (
    "name: crowded\nneuralnet:\n  layers:\n"
    + "".join(f"    - name: l{i}\n      type: dense\n      units: 4\n" for i in range(18_000))
).encode()


@pytest.mark.parametrize(
    ("content", "content_type", "status", "message"),
    [
        (b"name: [unclosed", "application/yaml", 422, "malformed YAML"),
        (b"", "application/yaml", 422, "empty"),
        (b"- a list\n- not a job\n", "text/yaml", 422, "a job must be a mapping"),
        (MLP.replace("train_steps", "train_stepz").encode(), "text/plain", 422, "train_stepz"),
        (MLP.replace("units: 256", "units: many").encode(), "application/x-yaml", 422, "units"),
        (b"\xff\xfe not utf-8", "application/yaml", 422, "not UTF-8"),
        (b"name: x", "application/xml", 415, "not accepted"),
        (b"name=x", "application/x-www-form-urlencoded", 415, "not accepted"),
        (b"{not json", "application/json", 422, "not valid JSON"),
        (b'{"spec": 3}', "application/json", 422, "spec"),
        (b'{"spec": "a: 1", "extra": 1}', "application/json", 422, "extra"),
        (b'{"spec": "a: 1", "priority": 9999999999}', "application/json", 422, "priority"),
        (b"[" * 300_000, "application/yaml", 422, "nest more than"),
        # 18,000 layers written out, about 0.9 MB: refused before the YAML parser reads it
        (LAYERS_18K, "application/yaml", 422, "refused before it is read"),
        (b'{"spec": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001, "application/json", 422, ""),
        (
            b"a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
            b"c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
            b"e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n",
            "application/yaml",
            422,
            "expands to more than",
        ),
        (
            MLP.replace("seed: 0", "seed: 100000000000000000000000").encode(),
            "text/yaml",
            422,
            "seed",
        ),
        (
            MLP.replace("train_steps: 2000", "train_steps: 99999999999").encode(),
            "text/yaml",
            422,
            "limit of 2147483647",
        ),
    ],
)
def test_specific_bad_bodies(
    api: Any, content: bytes, content_type: str, status: int, message: str
) -> None:
    for path in ("/api/v1/jobs/validate", "/api/v1/jobs"):
        before = api.counts()
        response = api.client.post(
            path, content=content, headers={**api.auth(), "content-type": content_type}
        )
        assert response.status_code == status, response.text
        assert message in response.json()["detail"]
        assert api.counts() == before


def test_oversized_bodies_get_413_with_or_without_a_length(api: Any) -> None:
    limit = api.settings.max_job_bytes
    body = b"# padding\n" * (limit // 10 + 1)
    before = api.counts()
    declared = api.client.post("/api/v1/jobs", content=body, headers=api.yaml_headers())
    assert declared.status_code == 413 and str(limit) in declared.json()["detail"]

    def chunks() -> Any:
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    chunked = api.client.post("/api/v1/jobs", content=chunks(), headers=api.yaml_headers())
    assert chunked.status_code == 413 and str(limit) in chunked.json()["detail"]
    assert api.counts() == before


@pytest.mark.parametrize(
    ("method", "path", "params"),
    [
        ("GET", "/api/v1/jobs/0", {}),
        ("GET", "/api/v1/jobs/abc", {}),
        ("GET", "/api/v1/jobs/99999999999999999999999", {}),
        ("GET", "/api/v1/jobs", {"limit": 0}),
        ("GET", "/api/v1/jobs", {"limit": 100000}),
        ("GET", "/api/v1/jobs", {"state": "DONE"}),
        ("GET", "/api/v1/jobs", {"cursor": "not-a-cursor"}),
        ("GET", "/api/v1/jobs", {"name": "x" * 101}),
        ("GET", "/api/v1/jobs/1/metrics", {"max_points": 0}),
        ("GET", "/api/v1/jobs/1/metrics", {"start_step": -1}),
        ("GET", "/api/v1/jobs/1/metrics", {"end_step": 2**40}),
        ("GET", "/api/v1/jobs/1/logs", {"after": -5}),
        ("GET", "/api/v1/jobs/1/logs", {"limit": "many"}),
        ("GET", "/api/v1/jobs/1/checkpoints/-1", {}),
        ("GET", "/api/v1/jobs/1/checkpoints/99999999999", {}),
        ("POST", "/api/v1/jobs/validate", {"priority": 10**9}),
    ],
)
def test_bad_parameters_are_422(api: Any, method: str, path: str, params: dict[str, Any]) -> None:
    api.submit(MLP)
    response = api.client.request(
        method, path, params=params, headers=api.yaml_headers(), content=MLP
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/api/v1/jobs/12345", 404),
        ("POST", "/api/v1/jobs/12345/cancel", 404),
        ("DELETE", "/api/v1/jobs/12345", 404),
        ("GET", "/api/v1/nothing-here", 404),
        ("PUT", "/api/v1/jobs", 405),
    ],
)
def test_unknown_ids_and_routes(api: Any, method: str, path: str, status: int) -> None:
    response = api.client.request(method, path, headers=api.auth())
    assert response.status_code == status
    assert response.json()["detail"]


# Each of these once answered 500 (issue 28); each must name what was wrong, and change nothing.
FIVE_HUNDREDS = [
    (MLP.replace("seed: 0", "seed: " + "9" * 5000), "seed", "not a valid int"),
    (MLP.replace("seed: 0", "seed: 2024-13-45"), "seed", "not a valid timestamp"),
    (MLP.replace("seed: 0", "seed: 0\n? " + "9" * 4400 + "\n: 1"), "<document>", "not a valid int"),
    (MLP.replace("name: digits-mlp", 'name: "a\\0b"'), "name", "NUL"),
]


@pytest.mark.parametrize(("document", "where", "message"), FIVE_HUNDREDS)
def test_scalars_python_cannot_hold_are_located(
    api: Any, document: str, where: str, message: str
) -> None:
    for path in ("/api/v1/jobs/validate", "/api/v1/jobs"):
        before = api.counts()
        response = api.client.post(path, content=document, headers=api.yaml_headers())
        assert response.status_code == 422, response.text
        (issue,) = response.json()["errors"]
        assert issue["path"] == where and message in issue["message"], issue
        assert issue["line"] is not None
        assert api.counts() == before


def test_a_forged_cursor_past_32_bits_is_422(api: Any) -> None:
    import base64

    for number in ("9" * 19, str(2**31), "1" * 5000):
        cursor = base64.urlsafe_b64encode(f"job:{number}".encode()).decode().rstrip("=")
        response = api.client.get(
            "/api/v1/jobs", params={"cursor": cursor[:200]}, headers=api.auth()
        )
        assert response.status_code == 422, response.text
        assert "cursor" in response.json()["detail"]


@pytest.mark.parametrize(
    ("path", "params", "where"),
    [
        ("/api/v1/jobs", {"name": "a\x00b"}, "query.name"),
        ("/api/v1/tokens", {"user": "\x00"}, "query.user"),
        ("/api/v1/jobs/a%00b", {}, "path"),
    ],
)
def test_nul_characters_in_the_address_are_422(
    api: Any, path: str, params: dict[str, str], where: str
) -> None:
    response = api.client.get(path, params=params, headers=api.auth())
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(where)


def test_nul_characters_in_a_json_body_are_4xx(api: Any) -> None:
    """The backstop: a value PostgreSQL refuses that no earlier check caught."""
    response = api.client.post("/api/v1/tokens", json={"name": "a\x00b"}, headers=api.auth())
    assert 400 <= response.status_code < 500, response.text


def test_base_dir_is_an_admins_and_names_a_folder(api: Any) -> None:
    def post(user: str, base_dir: str) -> Any:
        return api.client.post(
            "/api/v1/jobs/validate",
            json={"spec": MLP, "base_dir": base_dir},
            headers=api.auth(user),
        )

    refused = post("alice", "/etc")
    assert refused.status_code == 403, refused.text
    assert "base_dir '/etc'" in refused.json()["detail"]
    for bad in ("~nosuchuser", "~nosuchuser/data", "a\x00b"):
        response = post("admin", bad)
        assert response.status_code == 422, response.text
        assert "base_dir" in response.json()["detail"]
    assert post("admin", "/tmp").status_code == 200


def test_an_escape_past_the_last_code_point_is_located(api: Any) -> None:
    document = MLP.replace("seed: 0", 'seed: 0\nzzz: "\\U00110000"')
    response = api.client.post(
        "/api/v1/jobs/validate", content=document, headers=api.yaml_headers()
    )
    assert response.status_code == 422, response.text
    (issue,) = response.json()["errors"]
    assert issue["line"] == document.splitlines().index('zzz: "\\U00110000"') + 1
    assert issue["column"] == 7 and "U+0010FFFF" in issue["hint"]
