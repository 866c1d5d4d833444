"""One scheduler acts at a time: it holds a lease in Redis, renewed every pass.

A second scheduler (started by mistake, or by a supervisor that thought the first dead) waits
until the lease expires, `scheduler_lease_seconds` after the holder's last renewal, and then
takes over.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid

import redis

from contract.keys import Keys

log = logging.getLogger("trainyard.scheduler")

# Renew the lease if we hold it, else take it if nobody does: 1 when held afterwards.
_HOLD = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 1
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 1
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class SchedulerLease:
    def __init__(self, client: redis.Redis, keys: Keys, seconds: float) -> None:
        self.client, self.keys, self.seconds = client, keys, seconds
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._hold = client.register_script(_HOLD)
        self._release = client.register_script(_RELEASE)

    def hold(self) -> bool:
        """Take or renew the lease; whether this scheduler holds it now."""
        ms = max(int(self.seconds * 1000), 1)
        return bool(self._hold(keys=[self.keys.scheduler_lease], args=[self.holder, ms]))

    def holder_now(self) -> str:
        value = self.client.get(self.keys.scheduler_lease)
        return value.decode() if isinstance(value, bytes) else str(value or "nobody")

    def wait(self, stop: threading.Event) -> bool:
        """Block until this scheduler holds the lease (True) or `stop` is set (False)."""
        told = False
        while not stop.is_set():
            try:
                if self.hold():
                    log.info("scheduler %s holds the lease", self.holder)
                    return True
                if not told:
                    log.warning(
                        "another scheduler (%s) holds the lease; waiting", self.holder_now()
                    )
                    told = True
            except redis.RedisError as exc:
                log.warning("cannot reach Redis for the scheduler lease: %s", exc)
            stop.wait(min(1.0, self.seconds / 3))
        return False

    def release(self) -> None:
        with contextlib.suppress(redis.RedisError):  # else it expires on its own
            self._release(keys=[self.keys.scheduler_lease], args=[self.holder])
