"""What a response write says of the requests it answers, for pipeline/connections.py:
when each was answered (the evidence pipeline/steps.py reads), and which HTTP/2 stream's
own task wrote its response headers (the context that serves it)."""
from __future__ import annotations

from typing import Optional

from .model import Request
from .process_state import Conn
from .protocols.base import RequestFinished, ResponseStatus


def note_response(c: Conn, events: list, ts: int) -> None:
    """What a write did for the requests it answers (pipeline/steps.py's evidence):
    their response headers went out (the status was not known before it), or a body
    chunk did (headers with the end of the response count as its last chunk). A
    streamed response answers at each chunk; any other at its first write (its head:
    the body may follow in another write). Called before the events are applied."""
    for stream in c.session.written or c.streams:  # HTTP/1: its one open request, stream 0
        r = c.streams.get(stream)
        if r is None:
            continue
        head = done = False
        for e in events:
            if getattr(e, "stream", None) == stream:
                if type(e) is ResponseStatus and r.status is None:
                    head, r.streamed = True, e.streamed
                done = done or type(e) is RequestFinished
        if head and not r.headers_ts:
            r.headers_ts = ts
        body = done or not head
        r.chunks += body
        if (head and not r.streamed) or (body and r.streamed is not False):
            r.answered(ts)


def responding_stream(c: Conn, events: list) -> Optional[Request]:
    """The HTTP/2 request whose response headers this write carries, with no other
    stream's frames. Its writing context is that stream's own task when
    pipeline/contexts.py finds it tracked and newer than the request: hypercorn
    writes each stream's HEADERS from the stream's app task (measured), while its
    per-connection send task writes DATA for all streams. Any write binding, as on an
    HTTP/1 connection with one request, would bind that send task: made by the read
    that opened the first streams, it is newer than they are. For the same reason only
    the writing context binds, not its ancestors (a per-connection task can be every
    stream task's parent); a task the stream's task spawns is the stream's too.
    Not gRPC: C-core writes whatever frames are queued, from whichever thread holds its
    combiner, so with several RPCs open a write's context proves nothing (their pool
    threads: pipeline/handlers.py); with one open, any write binds as on HTTP/1 (C-core
    has no per-connection task in Python).
    Never a goroutine on a multiplexed connection (Connections.on_write): Go's HTTP/2 server
    (net/http, and grpc-go's loopy writer) writes every stream's frames from its serve
    loop or a goroutine started for the write, never from the stream's handler, which
    would then lose its calls to the writer (measured: a Go h2c request's calls were
    called outside it).
    What the rule assumes and the records cannot show: a task that writes one
    stream's response headers serves that stream. A server whose single writer task,
    made by the read that opened the first streams, wrote every stream's headers in
    turn would have that task bound to the first stream (its own CUDA calls, if it
    made any, would go there; its streams' tasks' calls would not)."""
    if len(c.session.written) != 1:  # HTTP/1 sessions carry no stream ids: empty
        return None
    (stream,) = c.session.written
    req = c.streams.get(stream)
    if req is None or not req.head.binds_at_own_headers:
        return None
    return req if any(type(e) is ResponseStatus and e.stream == stream for e in events) else None
