"""What a webhook delivery carries to a user's server, its headers and its signature; and which
addresses a webhook may be sent to.

The body is JSON: `{"id", "event", "created", "data"}`. The `Trainyard-Signature` header is
`t=<unix seconds>,v1=<hex>`, where hex is the HMAC-SHA256, keyed with the hook's secret, of
`<t>.<body>` (the timestamp, a dot, the body's bytes), as Stripe signs: a receiver recomputes it,
compares in constant time and refuses a timestamp too old (a replayed delivery).
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import time
from collections.abc import Callable, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

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


# -- where a webhook may be sent ----------------------------------------------------------------
# A webhook's host is checked twice: when the hook is registered (the API) and before each
# delivery (the scheduler), after resolving the name, and the delivery then connects to the
# address checked, never to a second answer of the resolver (a name whose answer changes in
# between, DNS rebinding, reaches nothing new). Public addresses only, unless an administrator
# allows networks (Settings.webhook_allow): else a webhook would be a way to probe the service's
# own network (the API on 127.0.0.1:8000, Redis, the cloud's 169.254.169.254).

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network
# A host name (or IP literal) and port -> its addresses; HostNotFound when it has none.
Resolver = Callable[[str, int], list[Address]]


class HostNotFound(Exception):
    """A host name the resolver has no address for."""


def resolve(host: str, port: int) -> list[Address]:
    """The host's addresses as the system's resolver answers (an IP literal in any spelling
    the C library reads, 0x7f000001 or 2130706433, is its own address), each once."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise HostNotFound(host) from exc
    return list(dict.fromkeys(ip_address(info[4][0]) for info in found))


def literal(host: str) -> Address | None:
    """The address a host spells, if it is an IP literal (in the C library's spellings too:
    0x7f000001, 017700000001, 127.1); None for a name."""
    try:
        return ip_address(host)
    except ValueError:
        pass
    try:
        return IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _reached(address: Address) -> list[Address]:
    """The addresses a connection to `address` reaches: an IPv4-mapped IPv6 address is its
    IPv4 address; a 6to4 one is itself and the IPv4 address it carries."""
    if isinstance(address, IPv6Address):
        if address.ipv4_mapped is not None:
            return [address.ipv4_mapped]
        if address.sixtofour is not None:
            return [address, address.sixtofour]
    return [address]


def _kind(address: Address) -> str | None:
    """Why a webhook may not reach `address` by default ('loopback', 'private'...), or None
    for a public address. The order names the narrowest kind: 127.0.0.1 is private too."""
    for kind in ("loopback", "unspecified", "link_local", "multicast", "site_local"):
        if getattr(address, f"is_{kind}", False):
            return kind.replace("_", "-")
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "non-public"  # shared (100.64.0.0/10) and the like
    return None


def refusal(address: Address, allow: Sequence[Network] = (), *, spelled: str = "") -> str | None:
    """Why a webhook may not be sent to `address` ("127.0.0.1 is a loopback address", with
    the address as `spelled` if given: "0x7f000001 is a loopback address"), or None when it
    may: a public address, or one in the networks an administrator allows."""
    for reached in _reached(address):
        kind = _kind(reached)
        if kind is None or any(reached in network for network in allow):
            continue
        article = "an" if kind[0] in "aeiou" else "a"
        if reached == address:
            return f"{spelled or address} is {article} {kind} address"
        return f"{spelled or address} reaches {reached}, {article} {kind} address"
    return None
