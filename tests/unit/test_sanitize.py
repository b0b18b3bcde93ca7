"""The one sanitiser for strings from the network and from other processes."""
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu import sanitize

PROPS = settings(max_examples=1500, deadline=None, database=None)
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def unsafe(c: str) -> bool:
    return (unicodedata.category(c) in ("Cc", "Cs") or c in "\u2028\u2029" or c in BIDI)


# Text rich in what matters: escape sequences, C1, bidi controls, surrogates, plain text.
hostile = st.lists(st.one_of(
    st.sampled_from(["\x1b[2J", "\x1b]0;title\x07", "\x9b31m", "\x7f", "\t", "\n", "\r", "\x00",
                     "\u202e", "\u2028", "\udcff", "\ud800", "/a", "é", "日本", "\ufffd", "…"]),
    st.text(max_size=20)), max_size=12).map("".join)


@PROPS
@given(hostile, st.one_of(st.none(), st.integers(1, 50)))
def test_output_has_no_unsafe_character_and_is_valid_utf8(value, limit):
    out = sanitize.text(value, limit)
    assert not [c for c in out if unsafe(c)]
    out.encode("utf-8")  # raises on a lone surrogate
    assert sanitize.text(out, limit) == out  # idempotent: render-time passes change nothing more
    if limit is not None:
        assert len(out) <= limit


@PROPS
@given(st.binary(max_size=80))
def test_any_bytes_give_safe_utf8(raw):
    out = sanitize.from_bytes(raw)
    assert not [c for c in out if unsafe(c)]
    out.encode("utf-8")
    if raw.isascii() and all(0x20 <= b < 0x7f for b in raw):
        assert out == raw.decode()


@PROPS
@given(st.text(st.characters(blacklist_categories=("Cc", "Cs", "Cf", "Zl", "Zp"))))
def test_printable_text_is_unchanged(value):
    assert sanitize.text(value) == value


def test_escape_sequences_lose_their_introducer_visibly():
    assert sanitize.text("a\x1b[2Jb\x1b]0;pwned\x07c\x9b31md") == "a\ufffd[2Jb\ufffd]0;pwned\ufffdc\ufffd31md"
    assert sanitize.text("x\u202eevil") == "x\ufffdevil"


def test_invalid_utf8_is_replaced_never_latin1():
    assert sanitize.from_bytes(b"caf\xc3\xa9 \xff\xfe \xc3(") == "café \ufffd\ufffd \ufffd("
    assert sanitize.from_bytes(b"\xc2\x9b") == "\ufffd"  # valid UTF-8 for U+009B: a C1 CSI


def test_surrogate_escaped_bytes_are_decoded_as_utf8():
    """os.readlink and os.environ hand non-UTF-8 bytes over as surrogates."""
    assert sanitize.text("caf\udcc3\udca9") == "café"
    assert sanitize.text("x\udcff") == "x\ufffd"


def test_other_format_characters_are_kept():
    assert sanitize.text("👩‍💻 a b") == "👩‍💻 a b"  # ZWJ emoji, no-break space


def test_bound_marks_the_cut():
    assert sanitize.text("abcdef", 4) == "abc…"
    assert sanitize.text("abcd", 4) == "abcd"


def test_attributes_keys_values_and_sequences():
    got = sanitize.attributes({"k\x1b": "v\x07", "n": 3, "seq": ("a\x9b", 1), "l": ["\x00"]})
    assert got == {"k\ufffd": "v\ufffd", "n": 3, "seq": ("a\ufffd", 1), "l": ["\ufffd"]}


def test_log_lines_from_hostile_names_stay_one_safe_line():
    """A library path or process name with ESC, OSC and a newline is logged as one line
    without control characters; a traceback keeps its line breaks."""
    import io
    import logging

    from otel_gpu.sanitize import LogFormatter

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(LogFormatter("%(levelname)s %(message)s"))
    log = logging.getLogger("test_sanitize_log")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("attached to %s", "/tmp/\x1b]0;owned\x07lib\ncudart.so\x1b[2J")
        try:
            raise ValueError("bad \x1b[31mname")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    first, *rest = out.getvalue().rstrip("\n").split("\n")
    assert first.startswith("WARNING attached to /tmp/") and "cudart.so" in first
    assert rest[0] == "ERROR failed" and "Traceback" in rest[1] and len(rest) >= 4
    for line in out.getvalue().split("\n"):
        assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in line), repr(line)
