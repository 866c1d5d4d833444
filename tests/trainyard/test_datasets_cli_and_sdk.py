"""Dataset uploads through a real stack: the CLI's chunked upload killed (SIGKILL) and resumed,
a user (not an admin) training the char-level example on their own text, classifiers trained
on a .csv and a .parquet with text columns whose model cards carry the categories (the
parquet streamed as shards), and a .tar of shards uploaded in parts, interrupted, resumed and
trained."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from dsl.model_card import read_model_card
from scheduler.cli.main import app
from tests.api.test_shard_uploads import npy
from trainyard import Client

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PART = 1 << 16


@pytest.fixture(scope="module")
def carol(stack: RunningStack) -> Client:
    """A user who is not an admin, for this module's tests."""
    created = CliRunner().invoke(app, ["admin", "create-user", "carol"], env=stack.env())
    assert created.exit_code == 0, created.output
    return Client(stack.url, created.stdout.strip().splitlines()[-1])


def cli(stack: RunningStack, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "scheduler", *args],
        cwd=ROOT,
        env=stack.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_the_cli_resumes_an_upload_after_a_sigkill(stack: RunningStack, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "big.npz"
    np.savez(path, x=rng.normal(size=(3000, 1000)).astype(np.float32), y=np.arange(3000) % 5)
    size = path.stat().st_size
    client = Client(stack.url, stack.token)
    args = ("datasets", "upload", str(path), "--name", "big", "--part-size", str(PART))
    first = cli(stack, *args)
    deadline = time.monotonic() + 60
    received: list[int] = []
    while time.monotonic() < deadline and len(received) < 5:
        received = next((u.received for u in client.uploads() if u.name == "big"), [])
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    upload = next(u for u in client.uploads() if u.name == "big")
    assert 5 <= len(upload.received) < upload.parts, "the upload ended before it was killed"

    second = cli(stack, *args)
    output = second.communicate(timeout=120)[0].decode()
    assert second.returncode == 0, output
    assert "resuming:" in output and "dataset big: npz" in output
    assert client.uploads() == []
    (dataset,) = [d for d in client.datasets() if d.name == "big"]
    assert dataset.size == size
    stored = stack.data_dir / "artifacts" / "datasets" / "1" / "big.npz"
    digest = hashlib.sha256(stored.read_bytes()).hexdigest()
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()

    listed = CliRunner().invoke(app, ["datasets", "list", "--json"], env=stack.env())
    assert listed.exit_code == 0 and '"name":"big"' in listed.stdout.replace(" ", "")
    deleted = CliRunner().invoke(app, ["datasets", "delete", "big"], env=stack.env())
    assert deleted.exit_code == 0, deleted.output
    assert not stored.exists()


def test_a_user_trains_the_char_level_example_on_their_own_text(
    carol: Client, tmp_path: Path
) -> None:
    text = tmp_path / "sonnets.txt"
    text.write_text("Shall I compare thee to a summer's day? Thou art more lovely. " * 300)
    info = carol.upload_dataset(text, "sonnets")
    assert info.kind == "text"
    document = yaml.safe_load((ROOT / "examples" / "char_rnn.yaml").read_text())
    document["data"]["dataset"] = "sonnets"
    quick = {"train_steps": 20, "disp_freq": 10, "test.freq": 20, "test.steps": 2}
    job = carol.submit(document, overrides=quick)
    assert job.wait(timeout=180, poll=0.2).state == "SUCCEEDED", job.error
    # Not another user's text, and not a server file.
    document["data"] = {"source": "text", "path": "/etc/hostname", "seq_len": 64}
    with pytest.raises(Exception, match="server file"):
        carol.submit(document, overrides=quick)


def test_a_classifier_on_a_csv_with_text_columns_keeps_its_categories(
    stack: RunningStack, tmp_path: Path
) -> None:
    client = Client(stack.url, stack.token)
    rng = np.random.default_rng(2)
    lines = ["colour,weight,fruit"]
    for _ in range(400):
        colour = ["red", "green", "yellow"][rng.integers(3)]
        fruit = {"red": "apple", "green": "pear", "yellow": "banana"}[colour]
        lines.append(f"{colour},{rng.normal():.3f},{fruit}")
    path = tmp_path / "fruit.csv"
    path.write_text("\n".join(lines) + "\n")
    assert client.upload_dataset(path, "fruit").kind == "shards"
    document = yaml.safe_load((ROOT / "examples" / "digits_mlp.yaml").read_text())
    document["data"] = {"source": "dataset", "name": "fruit", "batch_size": 32}
    job = client.submit(
        document, overrides={"train_steps": 40, "test.freq": 0, "checkpoint.freq": 40}
    )
    assert job.wait(timeout=120, poll=0.2).state == "SUCCEEDED", job.error
    card = read_model_card(job.download_checkpoint(tmp_path))
    assert card is not None and card.data.categories == {
        "features": {"colour": ["green", "red", "yellow"]},
        "label": ["apple", "banana", "pear"],
    }
    assert os.path.isdir(stack.data_dir / "artifacts" / "datasets" / "1" / "fruit")


def test_a_user_streams_a_parquet_with_text_columns_and_keeps_its_categories(
    stack: RunningStack, carol: Client, tmp_path: Path
) -> None:
    rng = np.random.default_rng(3)
    colours = rng.choice(["red", "green", "yellow"], size=600)
    fruit = {"red": "apple", "green": "pear", "yellow": "banana"}
    table = pa.table(
        {
            "colour": pa.array(colours).dictionary_encode(),
            "weight": pa.array(rng.normal(size=600)),
            "fruit": pa.array([fruit[c] for c in colours]),
        }
    )
    path = tmp_path / "orchard.parquet"
    pq.write_table(table, path, row_group_size=100)
    info = carol.upload_dataset(path, "orchard", label_column="fruit")
    assert info.kind == "shards"
    document = yaml.safe_load((ROOT / "examples" / "digits_mlp.yaml").read_text())
    # Streamed from the converted shards: the last of its 10 shards is the test split.
    document["data"] = {"source": "shards", "dataset": "orchard", "batch_size": 32}
    job = carol.submit(
        document, overrides={"train_steps": 60, "test.freq": 0, "checkpoint.freq": 60}
    )
    assert job.wait(timeout=120, poll=0.2).state == "SUCCEEDED", job.error
    assert job.summary["test/accuracy"] > 0.6  # 3 classes: chance is a third
    card = read_model_card(job.download_checkpoint(tmp_path))
    assert card is not None and card.data.categories == {
        "features": {"colour": ["green", "red", "yellow"]},
        "label": ["apple", "banana", "pear"],
    }
    (stored,) = (stack.data_dir / "artifacts" / "datasets").glob("*/orchard")
    assert len(list(stored.glob("*.x.npy"))) == 10


class Interrupted(Exception):
    """The upload's connection lost, as the client sees it."""


def test_a_tar_of_shards_uploaded_in_parts_resumes_and_trains(
    stack: RunningStack, carol: Client, tmp_path: Path
) -> None:
    rng = np.random.default_rng(4)
    centres = rng.normal(scale=3, size=(3, 32))
    path = tmp_path / "clusters.tar"
    with tarfile.open(path, "w") as archive:
        for index in range(6):
            y = rng.integers(0, 3, size=1000)
            x = (centres[y] + rng.normal(size=(1000, 32))).astype(np.float32)
            for suffix, array in (("x", x), ("y", y)):
                content = npy(array)
                member = tarfile.TarInfo(f"clusters/{index:05d}.{suffix}.npy")
                member.size = len(content)
                archive.addfile(member, io.BytesIO(content))
    sent: list[int] = []

    def cut_after_three_parts(done: int, total: int) -> None:
        sent.append(done)
        if len(sent) == 4:  # the call before the first part, then one a part
            raise Interrupted

    with pytest.raises(Interrupted):
        carol.upload_dataset(path, "clusters", part_size=PART, progress=cut_after_three_parts)
    (waiting,) = carol.uploads()
    assert waiting.received == [0, 1, 2] and waiting.parts == -(-path.stat().st_size // PART)
    resumed: list[int] = []
    info = carol.upload_dataset(
        path, "clusters", part_size=PART, progress=lambda done, total: resumed.append(done)
    )
    assert info.kind == "shards" and carol.uploads() == []
    # Only the parts the server lacked were sent again.
    assert resumed[0] == 3 * PART and len(resumed) == 1 + waiting.parts - 3
    document = yaml.safe_load((ROOT / "examples" / "digits_mlp.yaml").read_text())
    document["data"] = {"source": "shards", "dataset": "clusters", "batch_size": 64}
    job = carol.submit(document, overrides={"train_steps": 60, "test.freq": 0})
    assert job.wait(timeout=120, poll=0.2).state == "SUCCEEDED", job.error
    assert job.summary["test/accuracy"] > 0.8
