"""A TCP listener that accepts every connection and holds it idle: a busy front proxy,
or a flood, beside a GPU service in one container. Prints "listening on PORT"."""
from __future__ import annotations

import resource
import socket
import sys

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
print(f"listening on {listener.getsockname()[1]}", file=sys.stderr, flush=True)
held = []
while True:
    held.append(listener.accept()[0])
