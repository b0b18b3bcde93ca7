"""gRPC, a layer over HTTP/2 (content-type application/grpc*): the RPC's service and
method from :path (`/package.Service/Method`), its status from grpc-status in the
trailers (or in a trailers-only response)."""
from __future__ import annotations

from typing import Optional

from .... import sanitize

SYSTEM = "grpc"
# Codes an RPC server span reports as an error (OTel semantic conventions for gRPC).
SERVER_ERROR_CODES = frozenset({2, 4, 12, 13, 14, 15})


def is_grpc(content_type: Optional[str]) -> bool:
    return bool(content_type) and content_type.split(";", 1)[0].strip().lower().startswith("application/grpc")


def rpc_of(path: str) -> dict:
    """{system, service, method}; service/method None when :path is not `/S/M`."""
    parts = path.split("/")
    if len(parts) == 3 and not parts[0] and parts[1] and parts[2]:
        return {"system": SYSTEM, "service": sanitize.text(parts[1], sanitize.MAX_NETWORK_CHARS),
                "method": sanitize.text(parts[2], sanitize.MAX_NETWORK_CHARS)}
    return {"system": SYSTEM, "service": None, "method": None}


def status_code(raw: Optional[bytes]) -> Optional[int]:
    """grpc-status as an int (0..16 defined; other numbers kept as sent), None if absent
    or not a number."""
    if raw is None or not raw.isdigit() or len(raw) > 3:
        return None
    return int(raw)
