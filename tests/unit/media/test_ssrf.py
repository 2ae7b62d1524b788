"""The address classifier, as a table: every refused range at its edges,
the IPv4-mapped and -compatible spellings, and public neighbours."""

from __future__ import annotations

import ipaddress

import pytest

from mlxcel_trio.media import MediaPolicy
from mlxcel_trio.media.ssrf import allow_private_from_env, is_public, refusal

REFUSED = {
    # IPv4
    "0.0.0.0": "unspecified", "0.255.255.255": "unspecified",
    "127.0.0.1": "loopback", "127.255.255.254": "loopback",
    "10.0.0.0": "private", "10.255.255.255": "private",
    "172.16.0.1": "private", "172.31.255.255": "private",
    "192.168.0.1": "private", "192.168.255.255": "private",
    "169.254.169.254": "link-local", "169.254.0.0": "link-local",
    "100.64.0.0": "carrier-grade NAT", "100.127.255.255": "carrier-grade NAT",
    "192.0.0.0": "IETF", "192.0.0.255": "IETF",
    "198.18.0.0": "benchmarking", "198.19.255.255": "benchmarking",
    "192.0.2.1": "documentation", "198.51.100.7": "documentation",
    "203.0.113.255": "documentation",
    "224.0.0.1": "multicast", "239.255.255.255": "multicast",
    "240.0.0.1": "reserved", "255.255.255.255": "broadcast",
    # IPv6
    "::": "unspecified", "::1": "loopback",
    "fc00::1": "unique-local", "fdff:ffff::1": "unique-local",
    "fe80::1": "link-local", "febf:ffff::1": "link-local", "fe80::1%2": "link-local",
    "ff02::1": "multicast", "ff0e::1": "multicast",
    "2001:db8::1": "documentation", "2001:db8:ffff::1": "documentation",
    # IPv4-mapped and IPv4-compatible spellings of refused IPv4 addresses
    "::ffff:127.0.0.1": "loopback, written as IPv6",
    "::ffff:7f00:1": "loopback, written as IPv6",
    "::ffff:169.254.169.254": "link-local, written as IPv6",
    "::ffff:10.0.0.1": "private, written as IPv6",
    "::127.0.0.1": "loopback, written as IPv6",
    "::10.1.2.3": "private, written as IPv6",
    "::0.0.0.2": "unspecified",
}

PUBLIC = [
    "1.1.1.1", "8.8.8.8", "93.184.216.34", "9.255.255.255", "11.0.0.0",
    "100.63.255.255", "100.128.0.0", "126.255.255.255", "128.0.0.0",
    "169.253.255.255", "169.255.0.0", "172.15.255.255", "172.32.0.0",
    "192.0.1.0", "192.0.3.0", "192.167.255.255", "192.169.0.0",
    "198.17.255.255", "198.20.0.0", "198.51.99.255", "198.51.101.0",
    "203.0.112.255", "203.0.114.0", "223.255.255.255",
    "2606:4700:4700::1111", "2001:4860:4860::8888", "2001:db9::1", "2001:db7:ffff::1",
    "fbff:ffff::1", "fec0::1", "::ffff:8.8.8.8", "::8.8.8.8", "2a00:1450::1",
]


@pytest.mark.parametrize("text, why", sorted(REFUSED.items()))
def test_refused_addresses(text, why):
    address = ipaddress.ip_address(text)
    assert not is_public(address)
    assert why in refusal(address)


@pytest.mark.parametrize("text", PUBLIC)
def test_public_addresses(text):
    assert is_public(ipaddress.ip_address(text)), refusal(ipaddress.ip_address(text))


def test_the_allow_switch_is_off_by_default_and_read_from_the_environment():
    assert not allow_private_from_env({})
    assert not allow_private_from_env({"MLXCEL_ALLOW_PRIVATE_MEDIA_URLS": "0"})
    assert allow_private_from_env({"MLXCEL_ALLOW_PRIVATE_MEDIA_URLS": "1"})
    loopback = ipaddress.ip_address("127.0.0.1")
    assert not MediaPolicy.from_settings(None, env={}).permits(loopback)
    assert MediaPolicy.from_settings(
        None, env={"MLXCEL_ALLOW_PRIVATE_MEDIA_URLS": "1"}).permits(loopback)
