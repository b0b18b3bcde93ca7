"""protocols.detect: which protocol a connection's first bytes start."""
import pytest

from otel_gpu.pipeline import protocols
from otel_gpu.pipeline.protocols import PENDING, detect
from otel_gpu.pipeline.protocols.base import DETECT_MAX
from otel_gpu.pipeline.protocols.http1 import PROTOCOL as HTTP1

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.mark.parametrize("prefix", [b"", b"G", b"GE", b"GET", b"OPTIONS", b"DEL"])
def test_a_prefix_too_short_to_tell_is_pending(prefix):
    assert detect(prefix) is PENDING


@pytest.mark.parametrize("method", [b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"PATCH", b"OPTIONS",
                                    b"TRACE", b"CONNECT"])
def test_http1_methods_are_http1(method):
    assert detect(method + b" /x HTTP/1.1\r\n") is HTTP1
    assert detect(method + b" ") is HTTP1


@pytest.mark.parametrize("prefix", [b"\x16\x03\x01\x02\x00", b"*1\r\n$4\r\nPING\r\n", b"get / HTTP/1.1",
                                    b"GETX / HTTP/1.1", b"OPTIONSX", b"\x00" * 9])
def test_garbage_is_no_protocol(prefix):
    assert detect(prefix) is None


def test_the_h2_preface_is_not_http1():
    """Until an HTTP/2 protocol is registered, its preface is claimed by nobody (not
    mistaken for HTTP/1); one registered claims it."""
    registered = [p for p in protocols.PROTOCOLS if p.detect(H2_PREFACE)]
    got = detect(H2_PREFACE)
    assert got is not HTTP1
    assert got is (registered[0] if registered else None)
    assert HTTP1.detect(H2_PREFACE) is False
    assert HTTP1.detect(H2_PREFACE[:2]) is False  # "PR" starts no method


def test_a_protocol_that_never_decides_gives_up_at_detect_max(monkeypatch):
    class Undecided:
        name, label = "undecided", "UNDECIDED"

        def detect(self, prefix):
            return None
    monkeypatch.setattr(protocols, "PROTOCOLS", [Undecided()])
    assert detect(b"x" * (DETECT_MAX - 1)) is PENDING
    assert detect(b"x" * DETECT_MAX) is None


def test_an_earlier_undecided_protocol_is_waited_for(monkeypatch):
    """Order is priority: a later protocol does not win while an earlier one may still."""
    class Claims:
        name, label = "claims", "CLAIMS"

        def detect(self, prefix):
            return True
    monkeypatch.setattr(protocols, "PROTOCOLS", [HTTP1, Claims()])
    assert detect(b"GE") is PENDING
    assert detect(b"GET ").name == "http1"
    assert detect(b"\x16\x03").name == "claims"
    assert protocols.labels() == "HTTP/1.x nor CLAIMS"
