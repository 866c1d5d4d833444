"""Whether a node reaches the parameter-server Redis servers its processes would use.

A node agent that registered reaches the broker (REDIS_URL), but the parameter-server Redis
servers (REDIS_PS_URLS) may be on other hosts. The agent PINGs each one (`unreachable_ps`) at
its start and every PS_CHECK_SECONDS after, in a thread of its own, and writes what failed into
its registration (contract/nodes.py, `ps_unreachable`: "host:port: error" each, none when every
server answered). The scheduler keeps it on the node's row and places no process of a job with
server shards on that node (scheduler/placement/plan.py). Addresses only: a URL's password never
leaves the agent.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# How often the agent checks, and how long one server may take to connect and answer: short,
# since a server that takes longer would not serve the shards well either.
PS_CHECK_SECONDS = 10.0
PS_CHECK_TIMEOUT = 2.0
MAX_ERROR_CHARS = 200


def redis_address(client: redis.Redis) -> str:
    """host:port (or the socket's path) of the server `client` connects to; never its
    credentials."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    host = str(kwargs.get("host", "localhost"))
    return f"{f'[{host}]' if ':' in host else host}:{kwargs.get('port', 6379)}"


def _why(exc: redis.RedisError) -> str:
    """The cause in a few words: the socket's error ("connection refused") when there was
    one, else redis-py's message (a timeout, a refused password)."""
    cause = exc.__context__
    text = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
    return " ".join(text.split()).rstrip(".").lower()[:MAX_ERROR_CHARS] or type(exc).__name__


def unreachable_ps(urls: Sequence[str], timeout: float = PS_CHECK_TIMEOUT) -> list[str]:
    """PING each Redis of `urls` (connect and answer within `timeout` seconds each): the
    ones that did not answer, as "host:port: error"."""
    failed = []
    for url in dict.fromkeys(urls):  # the broker is often listed twice (the default)
        # One try: the next check comes soon, and retries would multiply the timeout.
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout, socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
        )
        try:
            client.ping()
        except redis.RedisError as exc:
            failed.append(f"{redis_address(client)}: {_why(exc)}")
        finally:
            client.close()
    return failed
