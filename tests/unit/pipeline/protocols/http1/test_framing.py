"""HTTP/1.x framing from what the socket probes copy (data <= 1024 bytes, length =
the syscall's full byte count)."""
import pytest

from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.protocols.http1.framing import MAX_HEAD, HttpParseError, RequestStream, ResponseStream

CAP = 1024


def probe_read(stream: RequestStream, raw: bytes) -> list[RequestHead]:
    """One read(2) of `raw`, as the probe reports it: the first CAP bytes + full length."""
    return stream.feed(raw[:CAP], len(raw))


def req(method="GET", target="/", version="1.1", headers=(), body=b"") -> bytes:
    lines = [f"{method} {target} HTTP/{version}".encode()]
    lines += [f"{k}: {v}".encode() for k, v in headers]
    if body:
        lines.append(f"Content-Length: {len(body)}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


# --- requests ------------------------------------------------------------------
def test_simple_get():
    heads = probe_read(RequestStream(), b"GET /infer/42 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert len(heads) == 1
    h = heads[0]
    assert (h.method, h.target, h.version, h.truncated) == ("GET", "/infer/42", "1.1", False)
    assert h.path == "/infer/42" and h.query is None


def test_keep_alive_sequence_on_one_stream():
    s = RequestStream()
    seen = []
    for i in range(5):
        seen += probe_read(s, req(target=f"/r/{i}"))
    assert [h.target for h in seen] == [f"/r/{i}" for i in range(5)]


def test_post_body_skipped_by_content_length():
    s = RequestStream()
    heads = probe_read(s, req("POST", "/a", body=b"GET /not-a-request HTTP/1.1\r\n\r\n"))
    assert [h.target for h in heads] == ["/a"]
    # The next read is a new request, not body.
    assert [h.target for h in probe_read(s, req(target="/b"))] == ["/b"]


def test_body_larger_than_the_copied_part_is_skipped_exactly():
    s = RequestStream()
    body = b"x" * 5000
    raw = req("POST", "/upload", body=body)
    assert len(raw) > CAP
    heads = s.feed(raw[:CAP], len(raw))  # only 1024 bytes copied, 5000+ read
    assert [h.target for h in heads] == ["/upload"]
    assert heads[0].truncated is False
    assert [h.target for h in probe_read(s, req(target="/next"))] == ["/next"]


def test_body_spread_over_later_reads_with_uncopied_bytes():
    s = RequestStream()
    head = b"PUT /blob HTTP/1.1\r\nContent-Length: 10000\r\n\r\n"
    assert [h.target for h in s.feed(head, len(head))] == ["/blob"]
    # 3 reads of body: 4000 (1024 copied), 4000 (1024 copied), 2000 (1024 copied)
    for n in (4000, 4000, 2000):
        assert s.feed(b"\xff" * CAP, n) == []
    assert [h.target for h in probe_read(s, req(target="/after"))] == ["/after"]


def test_head_split_across_reads():
    raw = req(target="/split", headers=[("Connection", "keep-alive"), ("Traceparent", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")])
    s = RequestStream()
    out = []
    for i in range(0, len(raw), 7):
        out += probe_read(s, raw[i:i + 7])
    assert [h.target for h in out] == ["/split"]
    assert out[0].headers["traceparent"].startswith("00-aaaa")


def test_head_fed_one_byte_at_a_time():
    raw = req("POST", "/one", body=b"hello") + req(target="/two")
    s = RequestStream()
    out = []
    for i in range(len(raw)):
        out += s.feed(raw[i:i + 1], 1)
    assert [h.target for h in out] == ["/one", "/two"]


def test_pipelined_requests_in_one_read():
    raw = req(target="/1") + req("POST", "/2", body=b"abc") + req("DELETE", "/3")
    heads = probe_read(RequestStream(), raw)
    assert [(h.method, h.target) for h in heads] == [("GET", "/1"), ("POST", "/2"), ("DELETE", "/3")]


def test_truncated_head_then_resync_on_next_method():
    s = RequestStream()
    raw = b"GET /big HTTP/1.1\r\nConnection: close\r\nX-Pad: " + b"p" * 3000 + b"\r\n\r\n"
    heads = s.feed(raw[:CAP], len(raw))
    assert len(heads) == 1
    h = heads[0]
    assert h.truncated is True and h.target == "/big"
    assert h.headers == {"connection": "close"}  # the cut-off last line is not trusted
    # A read that does not start with a method is ignored while resynchronising...
    assert s.feed(b"ppppp\r\n\r\n", 9) == []
    # ... and the next request is found again.
    assert [x.target for x in probe_read(s, req(target="/again"))] == ["/again"]


def test_truncated_request_line_raises():
    raw = b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\n\r\n"
    with pytest.raises(HttpParseError):
        RequestStream().feed(raw[:CAP], len(raw))


@pytest.mark.parametrize("data", [
    bytes(range(256)) * 2,
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x11" * 40,  # TLS ClientHello
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",                              # HTTP/2 preface
    b"get / HTTP/1.1\r\n\r\n",                                        # lower-case method
    b"GET / HTTP/1.2\r\n\r\n",
    b"FOO / HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nno-colon-here\r\n\r\n",
    b"GET / HTTP/1.1\r\nX : y\r\n\r\n",
    b"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
    b"POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n",
    b"SSH-2.0-OpenSSH_9.2\r\n",
])
def test_non_http_raises(data):
    with pytest.raises(HttpParseError):
        probe_read(RequestStream(), data)


def test_tls_client_hello_rejected_on_first_eight_bytes():
    with pytest.raises(HttpParseError):
        RequestStream().feed(b"\x16\x03\x01\x02\x00\x01\x00\x01", 8)


def test_head_over_64k_raises_when_fed_in_pieces():
    s = RequestStream()
    s.feed(b"GET / HTTP/1.1\r\n", 16)
    line = b"X-H: " + b"v" * 1017 + b"\r\n"  # 1024 bytes, never CRLFCRLF
    with pytest.raises(HttpParseError, match="64 KiB"):
        for _ in range(MAX_HEAD // CAP + 2):
            s.feed(line, len(line))


def test_head_over_64k_raises_when_most_was_not_copied():
    with pytest.raises(HttpParseError, match="64 KiB"):
        RequestStream().feed(b"GET / HTTP/1.1\r\nX: " + b"v" * 900, MAX_HEAD + 10)


def test_head_just_under_64k_is_accepted():
    s = RequestStream()
    raw = b"GET /ok HTTP/1.1\r\nX-H: " + b"v" * (MAX_HEAD - 200) + b"\r\n\r\n"
    out = []
    for i in range(0, len(raw), CAP):
        out += probe_read(s, raw[i:i + CAP])
    assert [h.target for h in out] == ["/ok"]


@pytest.mark.parametrize("target,path,query", [
    ("/a/b?x=1&y=2", "/a/b", "x=1&y=2"),
    ("/a?", "/a", ""),
    ("/a#frag", "/a", None),
    ("/?q", "/", "q"),
    ("?only", "/", "only"),
    ("/p?x=1?y", "/p", "x=1?y"),
    ("*", "*", None),
])
def test_query_and_path_split(target, path, query):
    h = probe_read(RequestStream(), req("OPTIONS", target))[0]
    assert (h.path, h.query) == (path, query)


@pytest.mark.parametrize("version,connection,keep", [
    ("1.1", None, True),
    ("1.1", "close", False),
    ("1.1", "Close", False),
    ("1.1", "keep-alive", True),
    ("1.0", None, False),
    ("1.0", "keep-alive", True),
    ("1.0", "Keep-Alive", True),
    ("1.0", "close", False),
])
def test_keep_alive_rules(version, connection, keep):
    headers = [("Connection", connection)] if connection else []
    h = probe_read(RequestStream(), req(version=version, headers=headers))[0]
    assert h.keep_alive is keep


SECRET_HEADERS = [("Authorization", "Bearer s3cret"), ("Cookie", "session=abc"),
                  ("X-Api-Key", "k"), ("Host", "example")]


def test_only_kept_headers_are_retained():
    raw = req("POST", "/x", headers=SECRET_HEADERS + [("Traceparent", "tp"), ("Tracestate", "ts"),
                                                      ("Connection", "keep-alive")], body=b"12")
    h = probe_read(RequestStream(), raw)[0]
    assert set(h.headers) == {"traceparent", "tracestate", "connection", "content-length"}
    assert "s3cret" not in repr(h) and "session=abc" not in repr(h)


def test_extra_headers_are_retained_when_configured():
    s = RequestStream(extra_headers=frozenset({"authorization", "x-api-key"}))
    h = probe_read(s, req(headers=SECRET_HEADERS))[0]
    assert h.headers["authorization"] == "Bearer s3cret"
    assert h.headers["x-api-key"] == "k"
    assert "cookie" not in h.headers and "host" not in h.headers


def test_chunked_request_body_resyncs_on_next_request():
    s = RequestStream()
    raw = b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    assert [h.target for h in probe_read(s, raw)] == ["/c"]
    assert probe_read(s, b"3\r\nabc\r\n") == []  # more body: ignored
    assert [h.target for h in probe_read(s, req(target="/d"))] == ["/d"]


def test_content_length_with_unicode_digit_is_a_parse_error():
    with pytest.raises(HttpParseError):
        probe_read(RequestStream(), b"POST / HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n")


# --- responses -----------------------------------------------------------------
def write(rs: ResponseStream, raw: bytes, method="GET"):
    return rs.feed(raw[:CAP], len(raw), raw[-8:], method)


def started() -> ResponseStream:
    rs = ResponseStream()
    rs.start()
    return rs


def test_response_content_length_across_writes():
    rs = started()
    assert write(rs, b"HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n") is None
    assert rs.current.status == 200 and rs.current.body_left == 3000
    assert write(rs, b"a" * 2000) is None
    assert rs.current.body_left == 1000
    done = write(rs, b"b" * 1000)
    assert done is not None and done.complete and done.status == 200 and done.version == "1.1"
    assert rs.current is None


def test_response_head_and_large_body_in_one_write():
    rs = started()
    done = write(rs, b"HTTP/1.1 201 Created\r\nContent-Length: 4000\r\n\r\n" + b"z" * 4000)
    assert done is not None and done.status == 201


def test_response_head_split_across_writes():
    rs = started()
    assert write(rs, b"HTT") is None
    assert write(rs, b"P/1.0 404 Not Found\r\nContent-") is None
    done = write(rs, b"Length: 2\r\n\r\nno")
    assert done.status == 404 and done.version == "1.0"


def test_chunked_response_completes_on_terminator_in_tail():
    rs = started()
    assert write(rs, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n") is None
    assert rs.current.chunked is True
    assert write(rs, b"400\r\n" + b"q" * 1024 + b"\r\n") is None
    done = rs.feed(b"0\r\n\r\n", 5, b"0\r\n\r\n", "GET")
    assert done is not None and done.status == 200


def test_chunked_terminator_only_seen_in_tail_of_a_long_write():
    rs = started()
    write(rs, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    raw = b"1000\r\n" + b"q" * 4096 + b"\r\n0\r\n\r\n"
    assert b"0\r\n\r\n" not in raw[:CAP]
    assert write(rs, raw) is not None


@pytest.mark.parametrize("status,method", [(200, "HEAD"), (204, "GET"), (304, "GET")])
def test_no_body_responses(status, method):
    rs = started()
    done = write(rs, f"HTTP/1.1 {status} X\r\nContent-Length: 500\r\n\r\n".encode(), method)
    assert done is not None and done.status == status


def test_interim_100_continue_then_final_in_separate_writes():
    rs = started()
    assert write(rs, b"HTTP/1.1 100 Continue\r\n\r\n") is None
    assert rs.current is not None and rs.current.status is None
    done = write(rs, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert done.status == 200


def test_interim_and_final_in_one_write():
    rs = started()
    done = write(rs, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nContent-Length: 1\r\n\r\n!")
    assert done is not None and done.status == 202


def test_close_delimited_body_never_completes_by_bytes():
    rs = started()
    assert write(rs, b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nsome body") is None
    assert rs.current.status == 200 and rs.current.body_left is None
    assert write(rs, b"x" * 5000) is None
    assert rs.current.complete is False


@pytest.mark.parametrize("raw", [b"HTTP/1.1 abc OK\r\n\r\n", b"HTTP/2 200\r\n\r\n",
                                 b"<html>hello</html>", b"HTTP/1.1 200 OK\r\nbad\r\n\r\n"])
def test_bad_status_line_raises(raw):
    with pytest.raises(HttpParseError):
        write(started(), raw)


def test_bytes_with_no_response_expected_are_ignored():
    assert write(ResponseStream(), b"HTTP/1.1 200 OK\r\n\r\n") is None


# --- hostile targets and headers (sanitised where they enter) ----------------------
@pytest.mark.parametrize("target,path,query", [
    (b"http://user:secret@host/a", "/a", None),
    (b"http://user:secret@host:8080/a/b?x=1", "/a/b", "x=1"),
    (b"https://user:secret@host", "/", None),
    (b"http://user:secret@host?q=1", "/", "q=1"),
    (b"HTTP://u:p@h/x#frag", "/x", None),
    (b"/plain/path", "/plain/path", None),
    (b"/x/http://u:p@h/y", "/x/http://u:p@h/y", None),  # origin-form: a path, left as it is
])
def test_absolute_form_targets_lose_scheme_and_userinfo(target, path, query):
    h = probe_read(RequestStream(), b"GET " + target + b" HTTP/1.1\r\n\r\n")[0]
    assert (h.path, h.query) == (path, query)
    if b"@host" in target:
        assert "secret" not in h.target and "user" not in h.target


def test_escape_sequences_and_invalid_utf8_in_the_target_are_replaced():
    raw = b"GET /a\x1b[2J\x1b]0;pwned\x07/\x9b31m\xff\xc3\xa9?k=\x1b[31m HTTP/1.1\r\n\r\n"
    h = probe_read(RequestStream(), raw)[0]
    assert h.path == "/a\ufffd[2J\ufffd]0;pwned\ufffd/\ufffd31m\ufffdé"  # UTF-8, never Latin-1
    assert h.query == "k=\ufffd[31m"


def test_a_long_target_is_bounded():
    raw = b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n"
    s = RequestStream()
    h = [x for i in range(0, len(raw), CAP) for x in probe_read(s, raw[i:i + CAP])][0]
    assert len(h.path) == 1024 and h.path.endswith("…")


def test_kept_header_values_are_sanitised():
    raw = req(headers=[("X-Note", "\x1b[31mred\x07 \xc3\x28"), ("Traceparent", "00-x")])
    raw = raw.replace("\xc3\x28".encode(), b"\xc3\x28")  # the raw bytes, not their UTF-8
    h = probe_read(RequestStream(frozenset({"x-note"})), raw)[0]
    assert h.headers["x-note"] == "\ufffd[31mred\ufffd \ufffd("


@pytest.mark.parametrize("raw", [
    b"GET /x?token=S3CRETQ HTTP/1.2\r\n\r\n",      # request line refused by the framer
    b"get /?k=S3CRETQ HTTP/1.1\r\n\r\n",           # not a method: refused at its first bytes
    b"GET /ok HTTP/1.1\r\nAuthorization S3CRETQ\r\n\r\n",  # header line without a colon
])
def test_a_refused_head_is_described_without_its_content(raw):
    with pytest.raises(HttpParseError) as e:
        probe_read(RequestStream(), raw)
    assert "S3CR" not in str(e.value) and "?" not in str(e.value)
    assert "bytes" in str(e.value)


def test_a_refused_response_is_described_without_its_content():
    for raw in (b"<html>S3CRETQ</html>", b"HTTP/1.1 abc S3CRETQ\r\n\r\n"):
        with pytest.raises(HttpParseError) as e:
            write(started(), raw)
        assert "S3CR" not in str(e.value)
