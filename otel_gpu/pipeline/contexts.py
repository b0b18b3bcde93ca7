"""Execution units of one traced process (Python contexts, Go goroutines), and which
request each belongs to.

The probes report every copy of a contextvars.Context (ContextCopy: a new asyncio Task,
a call_soon handle, copy_context() before a worker thread runs code in it) and the
context running on the thread of each CUDA call and socket read/write. From those:

- forest: ctx -> parent. A context is *tracked* once seen as the ctx of a ContextCopy;
  a thread on which a tracked context ran is a *context thread* (event loop, worker).
- binding: a request binds at its first response write made in a tracked context that
  was created after the request started (its own task: the loop's base context and a
  connection's callbacks are older, so their writes never bind), together with that
  context's ancestors that are newer than the request too (the task that spawned the
  streaming task, the task that registered a write callback). On an HTTP/2 connection
  (many streams, one socket) only a write of one stream's response headers binds, and
  only its own context (responses.responding_stream). A context bound to an
  open request is never bound to another; bindings end when the request finishes.
- calls: a call made in context C belongs to the request bound to C or to its nearest
  bound ancestor (task). A tracked C with no binding yet is *held*: when a request
  binds C or an ancestor of C, the call is that request's; once every request open when
  it was made (its candidates) has bound another context or finished, it is outside
  (all of them bound their own contexts) or ambiguous (linked to the ones that never
  bound). A call in an untracked context on a context thread (a task from before the
  probes) is held the same way, in a context no request can bind: never the one open
  request's. ctx == 0 (not Python, or not known): the stitcher's thread rules.

Go goroutines (ctx = GO_UNIT | goid; bpf/go_probes.c) are units of the same forest: a
goroutine start is a ContextCopy (made by its creator), every goroutine met is tracked.
- binding: on a connection that serves one request at a time (HTTP/1), the goroutine
  that reads a request's head is bound to it until it finishes (net/http's connection
  goroutine runs the handler, and the next request only after this one is answered).
  On HTTP/2, the goroutine Go's server started as the handler of a request's stream
  (pipeline/go_h2.py) is bound to it until it finishes.
  A goroutine started after the request began by a goroutine bound to it is the
  request's too (a handler's fan-out); one started before belongs to no request the
  connection serves later.
- hand-offs (UnitWake): a goroutine that woke, or was woken by, a goroutine that read a
  request serves requests without being bound to one (a batcher fed by handlers). Its
  calls while requests are open are shared, linked to them; a goroutine with no such
  hand-off (background work) is outside, even while a request is open.

This is the `unit` policy of the hold engine (pipeline/held.py): its held calls are
keyed by the unit they were made in and watched by their candidates; a binding settles
them (Holds.bound), a finish never proves one (PASS). Nothing is guessed: a call reaches
a request only through a binding. Contexts are bounded by an LRU cap and an idle sweep
at each Tick."""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional

from ..kernel_io.abi import GO_UNIT
from ..records import ContextCopy, CudaCall, UnitWake
from .held import PASS, Holds, Outcome
from .model import Request

MAX_CONTEXTS = 50_000     # tracked contexts per process (LRU past it)
MAX_DEPTH = 64            # ancestors walked from a context
IDLE_NS = 120 * 10**9     # an unused context no open request may own is forgotten after this
THREAD_IDLE_NS = 600 * 10**9  # a context thread not seen for this long is forgotten
MAX_PARTNERS = 256        # hand-off partners remembered per goroutine


class Node:
    """One incarnation of a context (an address can be reused once it is freed)."""
    __slots__ = ("addr", "parent", "parent_created", "created", "used", "bound", "worked")

    def __init__(self, addr: int, parent: int, parent_created: Optional[int], created: int) -> None:
        self.addr, self.parent, self.parent_created = addr, parent, parent_created
        self.created = self.used = created
        self.bound: Optional[Request] = None
        self.worked = False    # made a CUDA call since it was last passed over for eviction


class ProcessContexts:
    name = "unit"  # the hold policy (pipeline/rules.py unit.held)

    def __init__(self, holds: Holds, stats, max_contexts: int = MAX_CONTEXTS) -> None:
        self.holds, self.stats, self.max_contexts = holds, stats, max_contexts
        self.nodes: OrderedDict[int, Node] = OrderedDict()  # addr -> Node, least recently used first
        self.threads: dict[int, int] = {}    # context thread -> last seen
        self.unbound: dict[int, Request] = {}  # id -> open request not bound yet
        self.readers: set[int] = set()         # goroutines that served a request (serves())
        self.partners: dict[int, set] = {}     # goroutine -> goroutines it woke or was woken by
        self._cands: Optional[tuple] = None  # the same tuple while `unbound` is unchanged
        self.bindings: dict[int, list] = {}  # id(request) -> Nodes bound to it

    # --- the forest ------------------------------------------------------------------
    def copied(self, ev: ContextCopy) -> None:
        if not ev.ctx:
            return
        self.threads[ev.tid] = ev.ts_ns
        parent = self.nodes.get(ev.parent)
        if parent is not None:
            self._touch(parent, ev.ts_ns)
        self.nodes.pop(ev.ctx, None)  # still there: that context was freed, its address reused
        self.nodes[ev.ctx] = Node(ev.ctx, ev.parent, parent.created if parent else None, ev.ts_ns)
        if len(self.nodes) > self.max_contexts:
            self._evict()

    def wake(self, ev: UnitWake) -> None:
        for unit, other in ((ev.woken, ev.waker), (ev.waker, ev.woken)):
            known = self.partners.pop(unit, None) or set()
            if len(known) < MAX_PARTNERS:
                known.add(other)
            self.partners[unit] = known  # most recently active last
        while len(self.partners) > self.max_contexts:
            del self.partners[next(iter(self.partners))]

    def hands_off(self, unit: int) -> bool:
        """`unit` is a goroutine that woke, or was woken by, one that read a request."""
        return bool(unit & GO_UNIT) and not self.readers.isdisjoint(self.partners.get(unit, ()))

    def _adopt(self, addr: int) -> Node:
        """A context whose creation we never saw, met on a context thread (a task started
        before the probes, the loop's own context). Every context a request owns is
        created after the request began, so this one can never be bound (created = 0):
        its calls are held like any unbound context's, outside once every open request
        bound its own context, ambiguous if one never did."""
        node = self.nodes[addr] = Node(addr, 0, None, 0)
        if len(self.nodes) > self.max_contexts:
            self._evict()
        return node

    def seen(self, tid: int, ctx: int, ts: int) -> Optional[Node]:
        """A socket read/write or CUDA call ran in `ctx` on `tid`: its node if tracked."""
        node = self.nodes.get(ctx)
        if node is not None:
            self.threads[tid] = ts
            self._touch(node, ts)
        return node

    def _touch(self, node: Node, ts: int) -> None:
        node.used = max(node.used, ts)
        self.nodes.move_to_end(node.addr)

    def _parent(self, node: Node) -> Optional[Node]:
        p = self.nodes.get(node.parent)
        return p if p is not None and p.created == node.parent_created else None

    def _owner(self, node: Node, ts: int = 0) -> Optional[Request]:
        """The request bound to `node` or its nearest bound ancestor, when every unit
        between them was made after that request began (a unit made earlier was made
        for an earlier request, or for none)."""
        n, depth, made = node, 0, None
        while n is not None and depth < MAX_DEPTH:
            if n.bound is not None:
                return n.bound if made is None or made > n.bound.start_ns else None
            made = n.created if made is None else min(made, n.created)
            n, depth = self._parent(n), depth + 1
            if n is not None and ts:
                self._touch(n, ts)
        return None

    def _evict(self) -> None:
        """Least recently used first; bound and holding contexts are kept, contexts that
        made CUDA calls get a second chance."""
        for _ in range(64):
            addr, node = next(iter(self.nodes.items()))
            if node.bound is not None or node.worked or self.holds.holding(self.name, node):
                node.worked = False
                self.nodes.move_to_end(addr)
                continue
            del self.nodes[addr]
            self.stats.add("contexts_evicted")
            return

    def sweep(self, now_ns: int, oldest_open_ns: Optional[int]) -> None:
        """At each Tick: forgets contexts no open request may own (created before the
        oldest open request), neither bound nor holding calls, unused for IDLE_NS."""
        gone = [a for a, n in self.nodes.items()
                if n.bound is None and now_ns - n.used > IDLE_NS and not self.holds.holding(self.name, n)
                and (oldest_open_ns is None or n.created < oldest_open_ns)]
        for a in gone:
            del self.nodes[a]
        for tid in [t for t, seen in self.threads.items() if now_ns - seen > THREAD_IDLE_NS]:
            del self.threads[tid]

    # --- requests --------------------------------------------------------------------
    def opened(self, req: Request) -> None:
        self.unbound[id(req)] = req
        self._cands = None

    def candidates(self) -> tuple:
        if self._cands is None:
            self._cands = tuple(self.unbound.values())
        return self._cands

    def bind(self, req: Request, ev, ancestors: bool = True) -> list[Outcome]:
        """A response write of `req` (SockIo `ev`): binds it to the write's context when
        that is tracked and newer than the request (with its ancestors newer than the
        request too, unless `ancestors` is False). The held calls it owns land."""
        node = self.seen(ev.tid, ev.ctx, ev.ts_ns)
        if node is None or id(req) not in self.unbound or node.created <= req.start_ns \
                or node.bound is not None:
            return []
        chain: list[Node] = []
        n: Optional[Node] = node
        while n is not None and n.created > req.start_ns and n.bound is None and len(chain) < MAX_DEPTH:
            n.bound = req
            chain.append(n)
            n = self._parent(n) if ancestors else None
        return self._bound(req, node, chain)

    def serves(self, req: Request, unit: int, tid: int, ts: int) -> list[Outcome]:
        """Goroutine `unit` serves `req` until `req` finishes: it read `req`'s head on a
        connection serving one request at a time (net/http's connection goroutine runs
        the handler), or Go's HTTP/2 server started it as the handler of `req`'s stream
        (pipeline/go_h2.py). Python contexts are not bound so (the loop's connection
        callbacks read; a task serves)."""
        if not unit & GO_UNIT or id(req) not in self.unbound:
            return []
        node = self.seen(tid, unit, ts) or self._adopt(unit)
        self.readers.add(unit)
        if node.bound is not None:  # still serving another request: never two at once
            return []
        node.bound = req
        return self._bound(req, node, [node])

    def _bound(self, req: Request, node: Node, chain: list) -> list[Outcome]:
        """`req` is bound to `node` (and `chain`): the held calls it owns land."""
        req.context = node.addr
        self.bindings[id(req)] = chain
        del self.unbound[id(req)]
        self._cands = None
        return self.holds.bound(req, lambda g: self._owner(g.key) is req)

    def hold(self, facts, calls, device: int, cands: tuple) -> None:
        """Holds calls made in unit facts.unit while `cands` may still bind it (unit.held)."""
        self.holds.hold(self, facts.unit, cands, cands, calls, device)

    def on_finish(self, group, req: Request) -> str:
        """A candidate finished without binding the group's unit: it proves nothing."""
        return PASS

    def finished(self, req: Request) -> None:
        """`req` is done: its bindings end."""
        if self.unbound.pop(id(req), None) is not None:
            self._cands = None
        for n in self.bindings.pop(id(req), ()):
            if n.bound is req:
                n.bound = None

    # --- calls -----------------------------------------------------------------------
    def call(self, ev: CudaCall):
        """(the tracked unit the call was made in, the request that owns it or None), or
        None: made in no tracked unit (the thread rules)."""
        node = self.nodes.get(ev.ctx)
        if node is None:
            if ev.tid not in self.threads and not ev.ctx & GO_UNIT:
                return None
            node = self._adopt(ev.ctx)
        self.threads[ev.tid] = ev.ts_ns
        self._touch(node, ev.ts_ns)
        node.worked = True
        return node, self._owner(node, ev.ts_ns)

    def state(self) -> dict:
        return {"contexts_tracked": len(self.nodes), "contexts_bound": sum(len(c) for c in self.bindings.values())}
