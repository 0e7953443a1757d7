"""gateway.transport.LightPeers over real socket pairs: what a busy read turn asks before it
goes on (issue 15: a flood must not make a light connection wait for whole turns)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from gateway.transport import LightPeers


@pytest.fixture
def peers() -> Iterator[LightPeers]:
    p = LightPeers()
    yield p
    p.close()


def test_input_on_a_light_socket_is_seen_until_it_is_read(peers: LightPeers) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        conn = object()
        peers.add(conn, ours.fileno())
        assert not peers.waiting()
        theirs.sendall(b"ack")
        assert peers.waiting()
        ours.recv(16)
        assert not peers.waiting()


def test_a_discarded_socket_no_longer_ends_turns(peers: LightPeers) -> None:
    """A connection leaves the set when its reading is paused: unread input must not end
    every busy turn for ever."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        conn = object()
        peers.add(conn, ours.fileno())
        theirs.sendall(b"publish")
        peers.discard(conn, ours.fileno())
        assert not peers.waiting()
        peers.discard(conn, ours.fileno())  # twice is harmless


def test_a_reused_descriptor_belongs_to_its_new_connection(peers: LightPeers) -> None:
    """The kernel reuses a closed socket's number; the old connection's late discard must not
    take the new one out of the set."""
    first, other = socket.socketpair()
    fd = first.fileno()
    old = object()
    peers.add(old, fd)
    fresh, theirs = socket.socketpair()
    first.close()  # epoll forgets it; the old connection's connection_lost comes later
    other.close()
    reused = socket.socket(fileno=os.dup2(fresh.fileno(), fd))  # the same number, a new socket
    fresh.close()
    with reused, theirs:
        new = object()
        peers.add(new, fd)
        peers.discard(old, fd)
        theirs.sendall(b"ack")
        assert peers.waiting()
