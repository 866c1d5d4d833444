"""Reading a job document: what is refused before the YAML parser runs."""

from __future__ import annotations

import pytest
import yaml

from dsl import source
from dsl.errors import JobSpecError


def layers(count: int) -> str:
    written = "".join(
        f"    - name: l{i}\n      type: dense\n      units: 4\n" for i in range(count)
    )
    return f"name: crowded\nneuralnet:\n  layers:\n{written}"


def test_a_document_of_18000_written_layers_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    composed: list[str] = []
    original = yaml.compose
    monkeypatch.setattr(yaml, "compose", lambda *a, **k: composed.append("") or original(*a, **k))
    text = layers(18_000)
    assert 800_000 < len(text) < 1_000_000  # under the API's body bound
    with pytest.raises(JobSpecError) as caught:
        source.parse_document(text)
    (issue,) = caught.value.issues
    assert "more than 10,000 keys" in issue.message
    # Located where the count passed the bound: 3 nodes of the head, 4 of each layer, so in
    # the 2,500th layer, whose 3 lines start after the head's 3.
    assert issue.line == 3 + 3 * 2_499 + 1
    assert composed == []


def test_a_document_just_under_the_bound_is_read() -> None:
    data, _ = source.parse_document(layers(2_400))  # 9,600 nodes and the 3 of the head
    assert len(data["neuralnet"]["layers"]) == 2_400


@pytest.mark.parametrize(
    "text",
    [
        "shape: [" + ",".join("1" for _ in range(10_001)) + "]\n",  # a flow list
        '{"a": [' + ",".join('{"k":1}' for _ in range(5_001)) + "]}\n",  # JSON, no spaces
        "items:\n" + "".join("- 1\n" for _ in range(10_001)),  # block items
    ],
    ids=["flow", "json", "block"],
)
def test_every_way_of_writing_nodes_counts(text: str) -> None:
    with pytest.raises(JobSpecError, match="refused before it is read"):
        source.parse_document(text)
