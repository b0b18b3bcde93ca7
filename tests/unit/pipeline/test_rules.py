"""pipeline/rules.py: the rule table is the one place, and the docs carry it as is:
names unique, outcomes real, every rule decided somewhere in the pipeline (a rule no code
names would be a promise nothing keeps), docs/attribution.md's table equal to it."""
import re
from pathlib import Path

from otel_gpu.pipeline.model import ATTRIBUTIONS
from otel_gpu.pipeline.rules import RULES, markdown

ROOT = Path(__file__).resolve().parents[3]


def test_rules_are_unique_and_name_real_outcomes():
    assert len({r.name for r in RULES}) == len(RULES)
    assert all(r.attribution in ATTRIBUTIONS for r in RULES)


def test_every_rule_is_decided_by_the_pipeline():
    code = "".join(p.read_text() for p in (ROOT / "otel_gpu" / "pipeline").glob("*.py") if p.name != "rules.py")
    named = set(re.findall(r'"((?:unit|handler|thread|process|group)\.\w+)"', code))
    assert named == {r.name for r in RULES}


def test_the_docs_carry_the_table():
    assert markdown() in (ROOT / "docs" / "attribution.md").read_text()


class _Req:
    def __init__(self, tid):
        self.tid = tid


def test_the_thread_and_process_rules_say_which_decided():
    from otel_gpu.pipeline.attribution import attribute
    a, b, c = _Req(1), _Req(1), _Req(2)

    def name(*args):
        return attribute(*args)[0].name
    assert name([], 1) == "process.idle"
    assert name([a, c], 1, {}, {1: {7}}) == "thread.unfollowed"
    assert name([a, c], 1) == "thread.one" and attribute([a, c], 1)[1] is a
    assert name([a, b, c], 1) == "thread.several"
    assert name([c], 3) == "process.one"
    assert name([c], 3, {3: 9}) == "process.several"  # a half-read head on that thread
    assert name([a, c], 3) == "process.several"
