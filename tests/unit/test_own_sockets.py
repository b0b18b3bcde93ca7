"""The collector's own connections (own_sockets.py): a connection from one of this
process's TCP sockets to the port it connected to is ours, found with real sockets; one
from a port ours also uses, to another server, is a client's (Linux shares a local port
between destinations); a peer elsewhere is never ours and costs no re-read; re-reads are
rate-limited, an answer from an old read is read again first, and a miss within the
interval is not sure (None) until refresh()."""
from __future__ import annotations

import socket
import subprocess
import sys

from otel_gpu.own_sockets import REFRESH_NS, OwnSockets, _connections


def test_a_connection_this_process_made_is_its_own():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, peer = server.accept()
    port = server.getsockname()[1]
    try:
        own = OwnSockets()
        assert own.owns(*peer, port) is True  # the accepted side's peer is our client socket's local end
        assert own.owns(*peer, None) is True  # its server port unknown: the local end decides
        assert _connections()[peer] == {port}
        assert OwnSockets().owns("127.0.0.1", 1, port) is False  # a port none of our sockets has (read now)
        assert own.owns("10.1.2.3", peer[1], port) is False  # another host's
        assert own.owns(None, None, port) is False
    finally:
        for s in (client, accepted, server):
            s.close()


def test_a_client_sharing_our_local_port_with_another_server_is_not_ours():
    """Another process connects from our socket's local port to a second server (Linux
    hands out one port to two destinations: here by SO_REUSEADDR on both): the traced
    server's accept names our local end as its peer, yet the connection is not ours."""
    ours_server, theirs_server = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    mine = socket.socket()
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    mine.connect(ours_server.getsockname())
    local, theirs_port = mine.getsockname(), theirs_server.getsockname()[1]
    code = ("import socket, sys; c = socket.socket(); c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"c.bind({local!r}); c.connect(('127.0.0.1', {theirs_port})); print(c.getsockname()[1], flush=True); "
            "sys.stdin.readline()")
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert int(other.stdout.readline()) == local[1]
        accepted, peer = theirs_server.accept()
        assert peer == local  # the same peer as our own connection's, seen from its server
        assert OwnSockets().owns(*peer, theirs_port) is False
        assert OwnSockets().owns(*local, ours_server.getsockname()[1]) is True
        accepted.close()
    finally:
        other.communicate("\n", timeout=10)
        for s in (mine, ours_server, theirs_server):
            s.close()


def test_re_reads_only_for_peers_that_could_be_ours_and_at_most_once_per_interval():
    reads, now, ends = [], [0], {("127.0.0.1", 5000): {4317}}
    own = OwnSockets(read=lambda: reads.append(now[0]) or dict(ends), clock=lambda: now[0])
    assert own.owns("127.0.0.1", 5000, 4317) and reads == [0]
    assert own.owns("::ffff:127.0.0.1", 5000, 4317)  # IPv4-mapped: the same end, from the cache
    assert own.owns("127.0.0.1", 5000, 8000) is None  # our local end, another server port: by an old read
    assert own.owns("127.0.0.1", 6000, 4317) is None and reads == [0]  # a miss within the interval: not sure
    assert not own.owns("192.0.2.7", 6000, 4317) and reads == [0]  # not an address of ours: never re-read
    now[0] = REFRESH_NS
    assert not own.owns("127.0.0.1", 6000, 4317) and reads == [0, REFRESH_NS]


def test_an_answer_from_an_old_read_is_read_again_first():
    """Our socket closed since the last read, and a client got its port: not ours."""
    reads, now, ends = [], [0], {("127.0.0.1", 5000): {4317}}
    own = OwnSockets(read=lambda: reads.append(now[0]) or dict(ends), clock=lambda: now[0])
    assert own.owns("127.0.0.1", 5000, 4317)
    ends.clear()
    now[0] = REFRESH_NS
    assert not own.owns("127.0.0.1", 5000, 4317) and reads == [0, REFRESH_NS]


def test_refresh_reads_now():
    reads, now, ends = [], [0], {}
    own = OwnSockets(read=lambda: reads.append(now[0]) or dict(ends), clock=lambda: now[0])
    assert own.owns("127.0.0.1", 5000, 4317) is False  # read now: sure
    ends[("127.0.0.1", 5000)] = {4317}  # our socket, newer than that read
    now[0] = 1
    assert own.owns("127.0.0.1", 5000, 4317) is None
    own.refresh()
    assert own.owns("127.0.0.1", 5000, 4317) is True and reads == [0, 1]
