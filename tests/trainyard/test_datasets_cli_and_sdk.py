"""Dataset uploads through a real stack: the CLI's chunked upload killed (SIGKILL) and resumed,
a user (not an admin) training the char-level example on their own text, and a classifier
trained on a .csv with text columns whose model card carries the categories."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from dsl.model_card import read_model_card
from scheduler.cli.main import app
from trainyard import Client

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PART = 1 << 16


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
    stack: RunningStack, tmp_path: Path
) -> None:
    created = CliRunner().invoke(app, ["admin", "create-user", "carol"], env=stack.env())
    assert created.exit_code == 0, created.output
    carol = Client(stack.url, created.stdout.strip().splitlines()[-1])
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
