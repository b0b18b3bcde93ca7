"""Strings from the network or from another process, made safe for every output.

A request path, a header value, a traced process's OTEL_SERVICE_NAME or command line,
a kernel name, a pod name: any of them may hold terminal escape sequences (ESC[2J clears
the screen, OSC 0 sets the window title, C1 0x9b is a one-byte CSI) or bytes that are
not UTF-8. They are sanitised once where they enter the pipeline, and the readers of the
local store do it again at render time (a store may come from an older version).

The rule, one for all: every control character (C0 including tab and newline, DEL, C1),
the Unicode line/paragraph separators and the bidirectional overrides/isolates (which
reorder what a terminal shows) become U+FFFD REPLACEMENT CHARACTER; bytes that are not
UTF-8 are decoded with U+FFFD per invalid sequence (what the OTel spec asks of
attribute strings; never Latin-1). The result is valid UTF-8, and an escape sequence
loses its introducer, so it prints as plain text. Printable text is kept as it is."""
from __future__ import annotations

import logging
import re
from typing import Optional

REPLACEMENT = "\ufffd"
ELLIPSIS = "…"  # marks a value cut at its bound
MAX_NETWORK_CHARS = 1024  # request target, header values, process values

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")
_SURROGATES = re.compile("[\ud800-\udfff]")


def text(value: str, limit: Optional[int] = None) -> str:
    """`value` with unsafe characters replaced, cut to `limit` characters (the last one
    then an ellipsis). Idempotent."""
    if not value.isprintable():  # one C pass; false for every character _UNSAFE names
        if _SURROGATES.search(value):
            value = _undo_surrogateescape(value)
        value = _UNSAFE.sub(REPLACEMENT, value)
    if limit is not None and len(value) > limit:
        value = value[:max(0, limit - 1)] + ELLIPSIS
    return value


def from_bytes(raw: bytes, limit: Optional[int] = None) -> str:
    """Bytes as UTF-8 (U+FFFD per invalid sequence), then `text`."""
    return text(raw.decode("utf-8", "replace"), limit)


def optional(value, limit: Optional[int] = None):
    """`text` for a string; anything else (None, numbers) as it is."""
    return text(value, limit) if isinstance(value, str) else value


def attributes(attrs: dict, limit: Optional[int] = None) -> dict:
    """Keys and string values (also inside lists and tuples) of an attribute mapping."""
    out = {}
    for k, v in attrs.items():
        if isinstance(v, (list, tuple)):
            v = type(v)(optional(x, limit) for x in v)
        out[text(k) if isinstance(k, str) else k] = optional(v, limit)
    return out


def _undo_surrogateescape(value: str) -> str:
    """Python hands non-UTF-8 bytes of file names and environments over as lone
    surrogates (surrogateescape): back to the bytes, then decoded with replacement."""
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate that is no escaped byte
        return _SURROGATES.sub(REPLACEMENT, value)


class LogFormatter(logging.Formatter):
    """The collector's log lines quote library paths and names from other processes:
    the message is sanitised like any output (one record, one line, so a name holding a
    newline cannot forge a log line); a traceback keeps its newlines and loses the rest."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = text(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:
        return "\n".join(text(line) for line in super().formatException(ei).split("\n"))

    def formatStack(self, stack_info: str) -> str:
        return "\n".join(text(line) for line in stack_info.split("\n"))
