"""A TCP listener that accepts every connection and holds it idle: a busy front proxy,
or a flood, beside a GPU service in one container. Prints "listening on PORT".

  python idle_listener.py [PORT] [--reuseport]
--reuseport: several of these share one port (SO_REUSEPORT), as a proxy's workers do,
so together they hold more connections than one process's descriptor limit allows."""
from __future__ import annotations

import resource
import socket
import sys

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
ports = [int(a) for a in sys.argv[1:] if a.isdigit()]
listener = socket.create_server(("127.0.0.1", ports[0] if ports else 0), backlog=4096,
                                reuse_port="--reuseport" in sys.argv[1:])
print(f"listening on {listener.getsockname()[1]}", file=sys.stderr, flush=True)
held = []
while True:
    held.append(listener.accept()[0])
