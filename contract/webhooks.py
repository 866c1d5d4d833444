"""What a webhook delivery carries to a user's server: its headers and its signature.

The body is JSON: `{"id", "event", "created", "data"}`. The `Trainyard-Signature` header is
`t=<unix seconds>,v1=<hex>`, where hex is the HMAC-SHA256, keyed with the hook's secret, of
`<t>.<body>` (the timestamp, a dot, the body's bytes), as Stripe signs: a receiver recomputes it,
compares in constant time and refuses a timestamp too old (a replayed delivery).
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Trainyard-Signature"
EVENT_HEADER = "Trainyard-Event"
DELIVERY_HEADER = "Trainyard-Delivery"  # the delivery's id, the same on each retry
TOLERANCE_SECONDS = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, timestamp: int | None = None) -> str:
    moment = int(time.time()) if timestamp is None else timestamp
    return f"t={moment},v1={signature(secret, moment, body)}"


def verify(secret: str, body: bytes, header: str, *, tolerance: float = TOLERANCE_SECONDS) -> bool:
    """Whether `header` signs `body` with `secret`, at most `tolerance` seconds ago."""
    parts = dict(item.partition("=")[::2] for item in header.split(","))
    stamp, given = parts.get("t", ""), parts.get("v1", "")
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > tolerance:
        return False
    return hmac.compare_digest(signature(secret, int(stamp), body), given)
