"""The fast tier's guards (tests/conftest.py): a connect to anything but loopback is refused and recorded."""

from __future__ import annotations

import socket

import pytest
from conftest import NET_REACHED, _is_local


def test_loopback_and_unix_addresses_are_local():
    assert _is_local(("127.0.0.1", 80)) and _is_local(("::1", 80, 0, 0)) and _is_local(("localhost", 8000))
    assert _is_local(("0.0.0.0", 80)) and _is_local("/tmp/some.sock")
    assert (
        not _is_local(("192.0.2.1", 80)) and not _is_local(("example.com", 443)) and not _is_local(("2001:db8::1", 1))
    )


def test_a_fast_test_cannot_reach_the_network(request):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s, pytest.raises(OSError, match="fast tier: no network"):
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: refused before any packet leaves
    assert request.node.stash[NET_REACHED] == ["('192.0.2.1', 9)"]
    request.node.stash[NET_REACHED].clear()  # this test meant to: do not fail it at teardown


def test_loopback_connects_still_work():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=5) as client:
            assert client.getpeername() == server.getsockname()
