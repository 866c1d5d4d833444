"""The words the node agent and its fork server (workers/fork_server.py) exchange.

One message per datagram over a Unix SOCK_SEQPACKET socket the agent passes in:
- the agent asks `run <allocation id> <redis url> <parameter-server urls>`, attaching the write
  end of the pipe the process's stdout and stderr go to; the URLs (with its job's Redis user
  and password; the second comma-separated) are what the process logs in with, and may be left
  out (its environment's REDIS_URL and REDIS_PS_URLS then);
- the server answers `started <allocation id> <pid>` (or `failed <allocation id> <why>`),
  and, when that process ends, `exited <pid> <exit code>` (negative: the signal).
"""

from __future__ import annotations

MESSAGE_BYTES = 4096
# What the server prints on stdout once it has done its imports.
READY = "trainyard: fork server ready"
RUN, STARTED, FAILED, EXITED = "run", "started", "failed", "exited"
