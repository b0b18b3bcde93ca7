"""The attribution rules: where each CUDA call goes, one ordered table.

A call carries its execution unit (`ctx`: a Python context, a goroutine, or 0 for a
plain OS thread). The first rule of RULES that applies decides; every call counts under
the rule that decided it (`otel-gpu status`: attribution_rules; the `stopped:` line).
Which rules apply is decided in three places, each named here by its rules' prefix:
  unit.*     pipeline/contexts.py: execution units, their bindings and lineage
  handler.*  pipeline/handlers.py: handler threads of multiplexed servers (gRPC)
  thread.*, process.*, group.*   pipeline/attribution.py: the rest; a thread's proof
             that it served one request alone, pipeline/threads.py
A held call (HELD) waits until its rule can settle it; it counts under the rule that
settles it. docs/attribution.md lists this table (a unit test keeps them equal).

Nothing is guessed: a call reaches one request only through a binding, a lineage, a
handler's proof, or a thread or process that had that request alone open; otherwise it
is ambiguous (linked to the candidates, each counting a share), shared (a batch step
for requests in flight, linked to all) or outside."""
from __future__ import annotations

from dataclasses import dataclass

from .model import AMBIGUOUS, OUTSIDE, PROCESS, SHARED, TASK, THREAD

HELD = "held"      # a verdict: kept until its request is known (then a rule below decides)
MAX_HELD = 100_000  # held calls and folds per process and engine; past it, ambiguous at once


@dataclass(frozen=True)
class Rule:
    name: str
    attribution: str  # model.ATTRIBUTIONS
    when: str


RULES: tuple[Rule, ...] = (
    # Execution units (pipeline/contexts.py)
    Rule("unit.bound", TASK, "made in an execution unit bound to a request, or in a unit that a bound one made "
         "after that request began (a Python task or a context copied from it; the goroutine that read an HTTP/1 "
         "head, or one it started)"),
    Rule("unit.bound_later", TASK, "held (see unit.unbound), then a request bound the unit or an ancestor"),
    Rule("unit.held_full", AMBIGUOUS, "would be held, but the process holds MAX_HELD calls already"),
    Rule("unit.unbound", AMBIGUOUS, "held while requests that had not bound a unit were open; the ones that never "
         "did may own it: linked to them"),
    Rule("unit.hand_off", SHARED, "a goroutine bound to no request that took work from or handed work to a "
         "request's goroutine (a batcher), while requests are open: linked to every open request"),
    Rule("unit.unowned", OUTSIDE, "made in a unit no open request can own: every open request bound a unit of its "
         "own (a background task or goroutine; a unit made for an earlier request)"),
    # Handler threads of multiplexed servers (pipeline/handlers.py)
    Rule("handler.stream", TASK, "held, then proven its stream's: a gRPC handler thread's call, the thread and "
         "context that wrote that stream's frames alone"),
    Rule("handler.unproven", AMBIGUOUS, "held for a handler thread, not proven any one stream's"),
    Rule("handler.held_full", AMBIGUOUS, "would be held for a handler thread, past MAX_HELD"),
    # Threads and processes (pipeline/attribution.py)
    Rule("process.idle", OUTSIDE, "no request open in the process, nor in a related one"),
    Rule("group.batch", SHARED, "no request open in the process, some open in related processes (same cgroup, "
         "parent or child): a batch step for them, cut at the process's synchronising calls, linked to all"),
    Rule("thread.unfollowed", AMBIGUOUS, "the thread also serves a connection no protocol session can follow"),
    Rule("thread.one", THREAD, "the thread read the head of exactly one open request, served that request's "
         "connection alone and no other connection while the request was open (held until it finishes: "
         "pipeline/threads.py)"),
    Rule("thread.unproven", AMBIGUOUS, "as thread.one, but the thread read or wrote another connection while the "
         "request was open, or another thread its connection (a pool or an M:N runtime moved work between "
         "threads): linked to the requests open at the call"),
    Rule("thread.held_full", AMBIGUOUS, "would be held for its thread's proof, past MAX_HELD"),
    Rule("thread.several", AMBIGUOUS, "the thread read the heads of several open requests"),
    Rule("process.one", PROCESS, "another thread, while the process has exactly one request open and the thread "
         "holds no half-read head"),
    Rule("process.several", AMBIGUOUS, "several requests open, none read by this thread"),
    Rule("process.untracked", AMBIGUOUS, "thread.one or process.one would decide, but the process has connections "
         "the kernel could not track: a request not seen may own the call"),
    Rule("process.unfollowed", AMBIGUOUS, "the call would be outside every request, or thread.one's or "
         "process.one's, but the process has an open HTTP/2 connection no session follows any more (its framing "
         "or header state was lost): requests not seen may own the call"),
    Rule("process.unseen", AMBIGUOUS, "thread.one or process.one would decide, but the call was made while HTTP "
         "records of the process were lost (ring buffer full) and their connections had not told so yet: a "
         "request not seen may own the call"),
)
BY_NAME = {r.name: r for r in RULES}


def rule(name: str) -> Rule:
    return BY_NAME[name]


def share(requests, count: float, among: int = 0) -> None:
    """`count` ambiguous calls may be any of their `among` candidates' (default: the
    requests given): each of `requests` counts its 1/N, so the shares summed over spans
    never exceed the calls."""
    n = among or len(requests)
    for r in requests:
        r.sink.summary.ambiguous += count / n


def markdown() -> str:
    """RULES as the table docs/attribution.md carries (`python -m otel_gpu.pipeline.rules`)."""
    rows = ["| # | rule | outcome | when |", "|---|---|---|---|"]
    rows += [f"| {i} | `{r.name}` | {r.attribution} | {r.when} |" for i, r in enumerate(RULES, 1)]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
