"""The attribution rules: where each CUDA call goes, one ordered table and its evaluator.

A call carries its execution unit (`ctx`: a Python context, a goroutine, or 0 for a
plain OS thread). Each rule has a predicate, a Python expression over `f`, the facts
the rules read (pipeline/rule_facts.py), for one or both of two moments:
  at the call (`call`: f is a CallFacts), and
  when held calls settle (`settle`: f is a SettleFacts), the calls a hold rule kept.
The predicates of each moment are compiled, in table order, into one function (decide,
settled): the first rule whose predicate holds decides.
A hold rule (`holds`) keeps the call in its process's one hold engine (pipeline/held.py)
under a unit policy, which proves or voids an owner later (`unit`: pipeline/contexts.py,
Python contexts and goroutines; `thread`: pipeline/threads.py, a thread that served one
request alone; `handler`: pipeline/handlers.py, gRPC handler threads). Past the engine's
one cap, process.held_full decides instead. Every call counts under the rule that
decided it (`otel-gpu status`: attribution_rules; the `stopped:` line); a held call
under the rule that settled it. `gives` names the fact that becomes the call's request
(task, thread, process) or its links (ambiguous, shared). docs/attribution.md carries
this table (a unit test keeps them equal).

Nothing is guessed: a call reaches one request only through a binding, a lineage, a
handler's proof, or a thread or process that had that request alone open; otherwise it
is ambiguous (linked to the candidates, each counting a share), shared (a batch step
for requests in flight, linked to all) or outside."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .model import AMBIGUOUS, OUTSIDE, PROCESS, SHARED, TASK, THREAD

HELD = "held"       # the outcome of a hold rule: kept until a rule can settle it
MAX_HELD = 100_000  # held calls and folds per process (one engine); past it, process.held_full


@dataclass(frozen=True)
class Rule:
    name: str
    attribution: str  # model.ATTRIBUTIONS, or HELD
    when: str
    call: Optional[str] = None    # predicate over CallFacts f: decides at the call
    settle: Optional[str] = None  # predicate over SettleFacts f: decides held calls
    gives: Optional[str] = None   # the fact naming the request or the links
    holds: Optional[str] = None   # the unit policy a hold rule keeps the call under


RULES: tuple[Rule, ...] = (
    Rule("unit.bound", TASK, "made in an execution unit bound to a request, or in a unit that a bound one made "
         "after that request began (a Python task or a context copied from it; the goroutine that read an HTTP/1 "
         "head or that Go's HTTP/2 server started for the request's stream, or one it started)",
         call="f.owner is not None", gives="owner"),
    Rule("unit.bound_later", TASK, "held (unit.held), then a request bound the unit or an ancestor",
         settle="f.policy == 'unit' and f.owner is not None", gives="owner"),
    Rule("unit.held", HELD, "made in a tracked unit bound to no request while requests that had not bound a "
         "unit were open: kept until one binds it or every one of them bound another unit or finished",
         call="f.unit is not None and bool(f.unit_cands)", gives="unit_cands", holds="unit"),
    Rule("unit.unbound", AMBIGUOUS, "held (unit.held); requests finished without binding a unit: they may own "
         "it, linked to them",
         settle="f.policy == 'unit' and bool(f.links)", gives="links"),
    Rule("unit.hand_off", SHARED, "a goroutine bound to no request that took work from or handed work to a "
         "request's goroutine (a batcher), while requests are open: linked to every open request",
         call="f.unit is not None and bool(f.open) and f.hands_off", gives="open"),
    Rule("process.unfollowed", AMBIGUOUS, "the call would be outside every request (or held calls would settle "
         "so), or thread.held's or process.one's, but the process has an open HTTP/2 connection no session "
         "follows any more (its framing or header state was lost): requests not seen may own the call",
         call="f.p.hidden > 0 and (not f.open or f.unit is not None or f.sole is not None)",
         settle="f.p.hidden > 0 and f.policy == 'unit'", gives="open"),
    Rule("group.batch", SHARED, "no request open in the process, some open in related processes (same cgroup, "
         "parent or child): a batch step for them, cut at the process's synchronising calls, linked to all",
         call="not f.open and bool(f.group)", gives="group"),
    Rule("process.idle", OUTSIDE, "no request open in the process, nor in a related one",
         call="not f.open"),
    Rule("unit.unowned", OUTSIDE, "made in a unit no open request can own: every open request bound a unit of its "
         "own (a background task or goroutine; a unit made for an earlier request)",
         call="f.unit is not None", settle="f.policy == 'unit'"),
    Rule("thread.unfollowed", AMBIGUOUS, "the thread also serves a connection no protocol session can follow",
         call="f.broken", gives="thread_or_open"),
    Rule("process.untracked", AMBIGUOUS, "thread.held or process.one would decide, but the process has "
         "connections the kernel could not track: a request not seen may own the call",
         call="f.p.untracked > 0 and f.sole is not None", gives="open"),
    Rule("process.unseen", AMBIGUOUS, "thread.held or process.one would decide, but the call was made while HTTP "
         "records of the process were lost (ring buffer full) and their connections had not told so yet: a "
         "request not seen may own the call",
         call="f.ev.http_unseen and f.sole is not None", gives="open"),
    Rule("thread.held", HELD, "the thread read the head of exactly one open request: kept until that request "
         "finishes, for the thread's proof (pipeline/threads.py)",
         call="len(f.on_thread) == 1", gives="open", holds="thread"),
    Rule("thread.one", THREAD, "held (thread.held), and the thread served that request's connection alone and no "
         "other connection while the request was open",
         settle="f.policy == 'thread' and f.owner is not None", gives="owner"),
    Rule("thread.unproven", AMBIGUOUS, "held (thread.held), but the thread read or wrote another connection while "
         "the request was open, or another thread its connection (a pool or an M:N runtime moved work between "
         "threads): linked to the requests open at the call",
         settle="f.policy == 'thread'", gives="links"),
    Rule("thread.several", AMBIGUOUS, "the thread read the heads of several open requests",
         call="len(f.on_thread) > 1", gives="on_thread"),
    Rule("process.one", PROCESS, "another thread, while the process has exactly one request open and the thread "
         "holds no half-read head",
         call="f.sole is not None", gives="sole"),
    Rule("handler.held", HELD, "several requests open, one an HTTP/2 stream; made in a Python context the probes "
         "never saw created, on a thread that never ran a tracked one and read none of them (a gRPC handler "
         "thread): kept until its stream is proven (pipeline/handlers.py)",
         call="f.handler_pair", gives="open", holds="handler"),
    Rule("handler.stream", TASK, "held (handler.held), then proven its stream's: the thread and context that "
         "wrote that stream's frames alone",
         settle="f.policy == 'handler' and f.owner is not None", gives="owner"),
    Rule("handler.unproven", AMBIGUOUS, "held (handler.held), not proven any one stream's",
         settle="f.policy == 'handler'", gives="links"),
    Rule("process.several", AMBIGUOUS, "several requests open, none read by this thread alone",
         call="True", gives="open"),
    Rule("process.held_full", AMBIGUOUS, "a hold rule applies, but the process holds MAX_HELD calls already: "
         "linked to the hold's candidates (counted: held_calls_overflow)"),
)
BY_NAME = {r.name: r for r in RULES}
HELD_FULL = BY_NAME["process.held_full"]


def rule(name: str) -> Rule:
    return BY_NAME[name]


def _first(moment: str):
    """The predicates of one moment (`call` or `settle`), in table order, as one
    function of the facts returning the first rule that applies, or None."""
    rules = [r for r in RULES if getattr(r, moment) is not None]
    lines = ["def first(f):"] + [f"    if {getattr(r, moment)}: return rules[{i}]" for i, r in enumerate(rules)]
    scope = {"rules": rules}
    exec(compile("\n".join(lines + ["    return None"]), f"<rules: {moment}>", "exec"), scope)
    return scope["first"]


decide = _first("call")      # CallFacts -> Rule (process.several applies to every call)
settled = _first("settle")   # SettleFacts -> Rule (each policy's last settle rule applies to all)


def markdown() -> str:
    """RULES as the table docs/attribution.md carries (`python -m otel_gpu.pipeline.rules`)."""
    rows = ["| # | rule | outcome | at the call | when held calls settle | when |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(RULES, 1):
        outcome = f"held ({r.holds})" if r.holds else r.attribution
        call, settle = (f"`{p}`" if p else "" for p in (r.call, r.settle))
        if r is HELD_FULL:
            call = "a hold rule applies, the cap is reached"
        rows.append(f"| {i} | `{r.name}` | {outcome} | {call} | {settle} | {r.when} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
