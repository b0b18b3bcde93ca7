"""Server connections a process held before we traced it, from its real /proc."""
import os
import socket

from otel_gpu.sockets import PortCache, existing_server_connections


def test_finds_the_server_side_of_keep_alive_connections_only():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    other = socket.socket()  # a listener with no connection
    other.bind(("127.0.0.1", 0))
    other.listen()
    clients = [socket.create_connection(srv.getsockname()) for _ in range(3)]
    accepted = [srv.accept()[0] for _ in clients]
    try:
        found = existing_server_connections("/proc", os.getpid())
        # Our client ends are established too, but on ports nobody here listens on.
        assert sorted(c.fd for c in found) == sorted(a.fileno() for a in accepted)
        assert {c.listen_fd for c in found} == {srv.fileno()}
        assert sorted(c.peer_port for c in found) == sorted(cl.getsockname()[1] for cl in clients)
        assert {c.peer_addr for c in found} == {"127.0.0.1"}
    finally:
        for s in clients + accepted + [srv, other]:
            s.close()


def test_a_process_without_sockets_has_none(tmp_path):
    assert existing_server_connections(str(tmp_path), 1) == []


def test_peer_of_an_accepted_connection():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    try:
        assert PortCache().peer(os.getpid(), conn.fileno()) == ("127.0.0.1", cli.getsockname()[1])
        assert PortCache().peer(os.getpid(), 9999) is None
    finally:
        for s in (cli, conn, srv):
            s.close()


def test_open_sockets_maps_fds_to_inodes_and_a_gone_process_to_none(tmp_path):
    from otel_gpu.sockets import open_sockets
    srv = socket.socket()
    try:
        mine = open_sockets("/proc", os.getpid())
        assert srv.fileno() in mine and mine[srv.fileno()] == os.fstat(srv.fileno()).st_ino
        assert open_sockets(str(tmp_path), 1) == {}
    finally:
        srv.close()
