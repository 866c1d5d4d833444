"""When each of the scheduler's loops (schedule, ingest, sweeps) last completed a pass: written
by the loops, read by the API's /healthz (a loop silent past `liveness_timeout_seconds` makes
the service degraded)."""

from __future__ import annotations

import time

import redis

from contract.codec import decode
from contract.keys import Keys


def record_pass(client: redis.Redis, keys: Keys, loop: str) -> None:
    """The loop `loop` completed a pass now."""
    client.hset(keys.liveness, loop, repr(time.time()))


def last_passes(client: redis.Redis, keys: Keys) -> dict[str, float]:
    """Each loop's last pass (unix time); a value that is no number is left out."""
    passes = {}
    for loop, text in decode(client.hgetall(keys.liveness)).items():
        try:
            passes[loop] = float(text)
        except ValueError:
            continue
    return passes
