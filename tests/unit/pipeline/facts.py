"""The stitcher behind the /proc facts stage, as wiring.py runs them, with the tests' own
/proc answers (named fakes of sockets.py and pipeline/groups.py)."""
from otel_gpu.pipeline.proc_facts import ProcFacts


class WithFacts:
    """process(batch): ProcFacts, then the Stitcher; anything else is the Stitcher's."""

    def __init__(self, stitcher, port_of=None, peer_of=None, group_of=None, sockets_of=None) -> None:
        self.stitcher = stitcher
        self.facts = ProcFacts(port_of or (lambda pid, lfd, fd: None), peer_of or (lambda pid, fd: None),
                               group_of or (lambda pid: None), sockets_of or (lambda pid: {}))

    def process(self, batch: list) -> list:
        return self.stitcher.process(self.facts.process(batch))

    def __getattr__(self, name):
        return getattr(self.stitcher, name)
