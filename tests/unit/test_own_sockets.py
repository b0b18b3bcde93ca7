"""The collector's own connections (own_sockets.py): a peer that is one of this process's
TCP sockets is ours, found with real sockets; a peer elsewhere is never ours and costs
no re-read; re-reads on a miss are rate-limited."""
from __future__ import annotations

import socket

from otel_gpu.own_sockets import REFRESH_NS, OwnSockets, _local_ends


def test_a_connection_this_process_made_is_its_own():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, peer = server.accept()
    try:
        own = OwnSockets()
        assert own.owns(*peer)  # the accepted side's peer is our client socket's local end
        assert peer in _local_ends()
        assert not own.owns("127.0.0.1", 1)  # a port none of our sockets has
        assert not own.owns("10.1.2.3", peer[1])  # another host's
        assert not own.owns(None, None)
    finally:
        for s in (client, accepted, server):
            s.close()


def test_re_reads_only_for_peers_that_could_be_ours_and_at_most_once_per_interval():
    reads, now = [], [0]
    own = OwnSockets(read=lambda: reads.append(now[0]) or {("127.0.0.1", 5000)}, clock=lambda: now[0])
    assert own.owns("127.0.0.1", 5000) and reads == [0]
    assert own.owns("::ffff:127.0.0.1", 5000)  # IPv4-mapped: the same end, from the cache
    assert not own.owns("127.0.0.1", 6000) and reads == [0]  # a miss within the interval: no re-read
    assert not own.owns("192.0.2.7", 6000) and reads == [0]  # not an address of ours: never re-read
    now[0] = REFRESH_NS
    assert not own.owns("127.0.0.1", 6000) and reads == [0, REFRESH_NS]
