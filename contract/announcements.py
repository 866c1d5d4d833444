"""The API's word to the scheduler that there is new work, over Redis pub/sub.

The scheduler's loops also look on their own (placement four times a second, sweeps every
second); an announcement only saves that wait, so one lost while Redis is away costs nothing
but the wait.
"""

from __future__ import annotations

import contextlib
import threading

import redis

from contract.keys import Keys

JOB, SWEEP = "job", "sweep"
RETRY_SECONDS = 1.0


def announce(client: redis.Redis, keys: Keys, kind: str, item_id: int) -> None:
    """Say a job or a sweep was just committed; Redis being down is no error here."""
    with contextlib.suppress(redis.RedisError):
        client.publish(keys.announcements, f"{kind} {item_id}")


def relay(
    client: redis.Redis,
    keys: Keys,
    stop: threading.Event,
    wake: dict[str, threading.Event],
) -> None:
    """Set `wake[kind]` for each announcement of that kind, until `stop` is set."""
    while not stop.is_set():
        try:
            with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                pubsub.subscribe(keys.announcements)
                while not stop.is_set():
                    message = pubsub.get_message(timeout=RETRY_SECONDS)
                    if message is None:
                        continue
                    data = message["data"]
                    words = (data.decode() if isinstance(data, bytes) else str(data)).split()
                    if words and words[0] in wake:
                        wake[words[0]].set()
        except (redis.RedisError, OSError):
            stop.wait(RETRY_SECONDS)
