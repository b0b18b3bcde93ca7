"""One thread doing TLS writes and reads over a loopback socket pair, through Python's
ssl module (OpenSSL's SSL_write_ex / SSL_read_ex on the system's libssl): each round
trip is one SSL_write_ex on one end and one SSL_read_ex on the other, 64 bytes. Prints
the thread's CPU time per round trip in µs (time.thread_time: what the uprobes' traps
cost the thread, not time it was preempted), the median of REPS runs.
`python -m bench.tls_loop CERT KEY [round trips]` (bench item 9)."""
from __future__ import annotations

import socket
import ssl
import statistics
import sys
import threading
import time

REPS = 7
PAYLOAD = b"x" * 64


def _pair(cert: str, key: str):
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.check_hostname, client_ctx.verify_mode = False, ssl.CERT_NONE
    a, b = socket.socketpair()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("server", server_ctx.wrap_socket(b, server_side=True)))
    t.start()
    client = client_ctx.wrap_socket(a, server_hostname="127.0.0.1")
    t.join(30)
    return client, out["server"]


def main() -> None:
    cert, key = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 20_000
    client, server = _pair(cert, key)
    runs = []
    for _ in range(REPS):
        t0 = time.thread_time()
        for _ in range(n):
            client.sendall(PAYLOAD)
            server.recv(len(PAYLOAD))
        runs.append((time.thread_time() - t0) / n * 1e6)
    print(f"{statistics.median(runs):.3f}")


if __name__ == "__main__":
    main()
