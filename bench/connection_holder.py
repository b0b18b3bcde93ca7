"""Holds N idle TCP connections to 127.0.0.1:PORT, made from the loopback source address
SRC, until its stdin closes (bench item 18: a flood larger than one process's
descriptor limit). Prints "held N" once they are all connected.

  python -m bench.connection_holder PORT SRC N"""
from __future__ import annotations

import resource
import socket
import sys


def main() -> None:
    port, src, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((src, 0))
        s.connect(("127.0.0.1", port))
        held.append(s)
    print(f"held {len(held)}", flush=True)
    sys.stdin.read()  # until the bench closes it


if __name__ == "__main__":
    main()
