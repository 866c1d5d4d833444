"""Shared fixtures. Torch runs one intra-op thread per process (2 threads on 2 cores is slower)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data cache for the whole session, so mnist1d is generated once."""
    return tmp_path_factory.mktemp("cache")
