"""Which network addresses a media fetch may reach.

A request may name an http(s) URL the server then fetches, so an
unauthenticated caller steers a fetch proxy.  Upstream applies no address
policy; mlxcel refuses every address that is not on the public internet,
from this one table.  `is_public` is the default predicate; the fetcher
asks it about an IP-literal host, about every address a host name resolves
to, about every redirect target, and about the peer a connection actually
reached.  MLXCEL_ALLOW_PRIVATE_MEDIA_URLS=1 (read by `allow_private_from_env`)
turns every check into a pass, for a deployment whose media lives on an
internal object store: reaching the private network is an explicit operator
decision.
"""

from __future__ import annotations

import ipaddress
from typing import Mapping

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOW_PRIVATE_ENV = "MLXCEL_ALLOW_PRIVATE_MEDIA_URLS"

# (network, why) -- the refused IPv4 ranges
REFUSED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = tuple(
    (ipaddress.IPv4Network(net), why) for net, why in (
        ("0.0.0.0/8", "unspecified (this network)"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier-grade NAT"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved (and the broadcast address)"),
    ))

# the refused IPv6 ranges; ::ffff:0:0/96 and ::/96 carry an IPv4 address
# and are judged by it (below)
REFUSED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(net), why) for net, why in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fc00::/7", "unique-local"),
        ("fe80::/10", "link-local"),
        ("ff00::/8", "multicast"),
        ("2001:db8::/32", "documentation"),
    ))

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")


def refusal(address: IPAddress) -> str | None:
    """Why `address` is not public, or None when it is."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:
            address = ipaddress.IPv6Address(address.compressed.split("%", 1)[0])
        for net, why in REFUSED_V6:
            if address in net:
                return why
        if address in _MAPPED or address in _COMPATIBLE:
            inner = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
            why = refusal(inner)
            return None if why is None else f"IPv4 {why}, written as IPv6"
        return None
    for net, why in REFUSED_V4:
        if address in net:
            return why
    return None


def is_public(address: IPAddress) -> bool:
    """The default address predicate of a media fetch."""
    return refusal(address) is None


def allow_private_from_env(env: Mapping[str, str]) -> bool:
    """MLXCEL_ALLOW_PRIVATE_MEDIA_URLS=1 (also true/yes/on) lifts the policy."""
    return env.get(ALLOW_PRIVATE_ENV, "").strip().lower() in ("1", "true", "yes", "on")
