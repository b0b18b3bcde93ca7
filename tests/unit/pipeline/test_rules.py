"""pipeline/rules.py: the rule table is the evaluator. Names unique, outcomes real, the
docs carry the table as is; and for each case, the rule that decides it (at the call,
and when held calls settle), with the precedence between rules that could both apply.
Every rule decides at least one case here (a rule no case reaches would be a promise
nothing keeps); process.held_full is reached through the stitcher (test_contexts.py,
test_handlers.py)."""
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from otel_gpu.pipeline.model import ATTRIBUTIONS
from otel_gpu.pipeline.process_state import Proc, StitchState
from otel_gpu.pipeline.rule_facts import CallFacts, SettleFacts
from otel_gpu.pipeline.rules import HELD, RULES, decide, markdown, settled
from otel_gpu.ratelimit import RateLimitedLog, Stats

ROOT = Path(__file__).resolve().parents[3]


def req(tid, multiplexed=False):
    return SimpleNamespace(tid=tid, head=SimpleNamespace(multiplexed=multiplexed))


A, B, C, H2 = req(1), req(1), req(2), req(2, multiplexed=True)
NODE = object()


def facts(open_=(), unit=None, tid=1, hidden=0, untracked=0, broken=(), partial=(), unseen=False,
          hands_off=False, pair=False, group=(), aggregate=False):
    p = Proc(900, hidden=hidden, untracked=untracked, broken={t: {9} for t in broken},
             partial_heads={t: 9 for t in partial})
    node, owner, cands = unit or (None, None, ())
    p.contexts = SimpleNamespace(hands_off=lambda unit: hands_off, candidates=lambda: cands)
    p.handlers = SimpleNamespace(pair_of_call=lambda ev, requests: pair)
    ev = SimpleNamespace(tid=tid, ctx=0x77, http_unseen=unseen)
    return CallFacts(p, ev, 10, list(open_), node, owner, lambda p: [SimpleNamespace(start_ns=0, r=r) for r in group],
                     aggregate)


def bound(owner):
    return NODE, owner, ()


def unbound(*cands):
    return NODE, None, tuple(cands)


CALLS = [  # (the rule that decides, the call's facts, what it gives)
    ("unit.bound", facts([A], unit=bound(A)), A),
    ("unit.held", facts([A], unit=unbound(A)), (A,)),
    ("unit.held", facts([], unit=unbound(A)), (A,)),  # a request begun after the call may still bind it
    ("unit.hand_off", facts([C], unit=unbound(), hands_off=True), [C]),
    ("process.unfollowed", facts([], hidden=1), []),
    ("process.unfollowed", facts([C], unit=unbound(), hidden=1), [C]),  # would be unit.unowned
    ("process.unfollowed", facts([A, C], hidden=1), [A, C]),            # would be thread.held
    ("process.unfollowed", facts([C], tid=3, hidden=1), [C]),           # would be process.one
    ("process.unfollowed", facts([], hidden=1, group=[C]), []),         # before group.batch
    ("unit.hand_off", facts([C], unit=unbound(), hands_off=True, hidden=1), [C]),  # before process.unfollowed
    ("group.batch", facts([], group=[C]), [C]),
    ("group.batch", facts([], unit=unbound(), group=[C]), [C]),
    ("process.idle", facts([]), None),
    ("process.idle", facts([], unit=unbound(), hands_off=True), None),  # a hand-off needs requests open
    ("unit.unowned", facts([C], unit=unbound()), None),
    ("thread.unfollowed", facts([A, C], broken=[1]), [A]),
    ("thread.unfollowed", facts([C], broken=[1]), [C]),
    ("thread.unfollowed", facts([A, C], broken=[1], hidden=1), [A]),  # broken: no sole request to hide
    ("process.untracked", facts([A, C], untracked=1), [A, C]),
    ("process.untracked", facts([C], tid=3, untracked=1, unseen=True), [C]),  # before process.unseen
    ("process.unseen", facts([A, C], unseen=True), [A, C]),
    ("process.several", facts([A, C], tid=3, unseen=True), [A, C]),  # no sole request: nothing to doubt
    ("thread.held", facts([A, C]), [A, C]),
    ("thread.several", facts([A, B, C]), [A, B]),
    ("process.one", facts([C], tid=3), C),
    ("process.several", facts([C], tid=3, partial=[3]), [C]),  # a half-read head on that thread
    ("handler.held", facts([C, H2], tid=3, pair=True), [C, H2]),
    ("process.several", facts([C, H2], tid=3, pair=True, aggregate=True), [C, H2]),  # kernel counts: not held
    ("process.several", facts([C, H2], tid=3, pair=True, untracked=1), [C, H2]),
    ("process.several", facts([C, req(2)], tid=3, pair=True), None),  # no HTTP/2 stream open
    ("process.one", facts([H2], tid=3, pair=True), H2),
]

SETTLES = [  # (the rule, held calls settling under a policy: its owner, its links, hidden connections)
    ("unit.bound_later", "unit", A, [], 0),
    ("unit.unbound", "unit", None, [A], 0),
    ("unit.unbound", "unit", None, [A], 1),
    ("process.unfollowed", "unit", None, [], 1),
    ("unit.unowned", "unit", None, [], 0),
    ("thread.one", "thread", A, [], 0),
    ("thread.unproven", "thread", None, [A, C], 0),
    ("handler.stream", "handler", H2, [], 0),
    ("handler.unproven", "handler", None, [C, H2], 0),
]


def test_rules_are_unique_and_name_real_outcomes():
    assert len({r.name for r in RULES}) == len(RULES)
    for r in RULES:
        assert r.attribution in ATTRIBUTIONS or (r.attribution == HELD and r.holds in ("unit", "thread", "handler"))
        assert (r.holds is None) == (r.attribution != HELD)
        assert r.gives is None or r.call is not None or r.settle is not None


def test_every_hold_rule_names_a_policy_of_each_process():
    stats = Stats()
    p = StitchState(256, stats, RateLimitedLog(logging.getLogger("test"), stats), False).proc(900, [])
    assert {r.holds for r in RULES if r.holds} == set(p.policies)
    assert all(name == policy.name for name, policy in p.policies.items())


def test_the_docs_carry_the_table():
    assert markdown() in (ROOT / "docs" / "attribution.md").read_text()


@pytest.mark.parametrize("name,f,gives", CALLS)
def test_the_rule_that_decides_a_call(name, f, gives):
    r = decide(f)
    assert r.name == name
    if gives is not None:
        given = getattr(f, r.gives)
        assert (given if r.gives != "group" else [g.r for g in given]) == gives


@pytest.mark.parametrize("name,policy,owner,links,hidden", SETTLES)
def test_the_rule_that_settles_held_calls(name, policy, owner, links, hidden):
    assert settled(SettleFacts(policy, owner, links, Proc(900, hidden=hidden))).name == name


def test_every_rule_decides_a_case():
    reached = {n for n, *_ in CALLS} | {n for n, *_ in SETTLES} | {"process.held_full"}
    assert reached == {r.name for r in RULES}
