"""Trainyard's Python client: submit jobs and sweeps to a Trainyard service and follow them.

    from trainyard import Client
    client = Client()                 # TRAINYARD_URL/TOKEN, `trainyard login`, or `trainyard up`
    job = client.submit("job.yaml")
    job.wait(progress=True)
    model = trainyard.load_model(job)  # its best checkpoint as a torch module; job.predict(x)

Importing it loads neither torch nor the server's packages (tests/test_structure.py).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from trainyard.client import Client, Job
from trainyard.errors import (
    AuthError,
    Conflict,
    JobSpecRejected,
    NotFound,
    RequestRejected,
    ServerError,
    TrainyardError,
    Unreachable,
    WaitTimeout,
)
from trainyard.loading import ModelError, load_model
from trainyard.sweeps import Sweep

try:
    __version__ = version("trainyard")
except PackageNotFoundError:  # a checkout on sys.path that was never installed
    __version__ = "unknown"

__all__ = [
    "AuthError",
    "Client",
    "Conflict",
    "Job",
    "JobSpecRejected",
    "ModelError",
    "NotFound",
    "RequestRejected",
    "ServerError",
    "Sweep",
    "TrainyardError",
    "Unreachable",
    "WaitTimeout",
    "__version__",
    "load_model",
]
