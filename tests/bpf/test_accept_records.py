"""bpf/http_probes.c accept_done in the real kernel: an accepted connection's record names
its socket's inode number, the number /proc lists it by (socket:[N]). User space tells a
seed read from /proc while the kernel's records of that connection were on their way
from a new socket on the fd by it (pipeline/connections.py on_accept)."""
from __future__ import annotations

import ctypes as ct
import socket
import sys

from otel_gpu.probes.pid_bits import TRACED
from otel_gpu.records import Accept
from tests.bpf.probe_harness import Child

# `accept`: takes one connection, says its fd and its socket's inode as /proc lists it.
SERVER = r'''
import json, os, socket, sys
listener = socket.create_server(("127.0.0.1", 0))
print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
held = []
for line in sys.stdin:
    conn, _ = listener.accept()
    held.append(conn)
    link = os.readlink(f"/proc/self/fd/{conn.fileno()}")
    print(json.dumps({"fd": conn.fileno(), "link": link}), flush=True)
'''


def test_an_accept_names_its_sockets_inode(probes):
    c = Child([sys.executable, "-c", SERVER])
    clients = []
    try:
        probes.set("traced", c.pid, ct.c_uint32(TRACED))
        said = []
        for _ in range(2):  # two: each record names its own socket
            c.send("accept")
            clients.append(socket.create_connection(("127.0.0.1", c.hello["port"])))
            said.append(c.reply())
        accepts = {r.fd: r for r in probes.of(c.pid) if type(r) is Accept}
        for s in said:
            assert s["link"].startswith("socket:[")
            assert accepts[s["fd"]].inode == int(s["link"][len("socket:["):-1]), (s, accepts)
        assert len({a.inode for a in accepts.values()}) == 2
    finally:
        for s in clients:
            s.close()
        c.stop()
        probes.unset("traced", c.pid)
