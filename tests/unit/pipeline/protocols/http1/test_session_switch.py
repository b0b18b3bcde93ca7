"""The HTTP/1 session at a 101 Switching Protocols: it hands the connection to HTTP/2 only
when the request asked for h2c (with valid HTTP2-Settings) and the 101 names h2c; any
other upgrade ends the request with status 101 and stops following the connection."""
import base64
import logging

import h2.config
import h2.connection

from otel_gpu.pipeline.protocols.base import (ProtocolError, RequestFinished, RequestStarted, SessionConfig,
                                              SwitchProtocol)
from otel_gpu.pipeline.protocols.http1.session import Http1Session


def client_settings():
    """The HTTP2-Settings value a real h2 client sends, and its decoded SETTINGS payload."""
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    header = c.initiate_upgrade_connection()
    return header, base64.urlsafe_b64decode(header + b"=" * (-len(header) % 4))


def upgrade_request(upgrade=b"h2c", settings=None, path=b"/infer?id=1"):
    settings = client_settings()[0] if settings is None else settings
    return (b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: " + upgrade + b"\r\nHTTP2-Settings: " + settings + b"\r\n\r\n")


def switching(upgrade=b"h2c"):
    return b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + upgrade + b"\r\n\r\n"


def session_with(request: bytes):
    s = Http1Session(SessionConfig())
    (started,) = s.on_read(request, len(request), 10, 7)
    assert isinstance(started, RequestStarted) and started.stream == 0
    return s, started.head


def write(s, raw: bytes, ts=20):
    return s.on_write(raw[:1024], len(raw), raw[-64:], ts, 7)


def test_101_to_h2c_hands_the_request_over_as_stream_1_with_the_rest_of_the_write():
    header, payload = client_settings()
    s, head = session_with(upgrade_request(settings=header))
    server_settings = b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64"
    (switch,) = write(s, switching() + server_settings)
    assert isinstance(switch, SwitchProtocol) and switch.name == "http2"
    h = switch.handover
    assert h.streams == {0: (1, head)} and (head.method, head.path) == ("GET", "/infer")
    assert h.settings == payload and len(payload) % 6 == 0
    assert (h.rest, h.rest_length) == (server_settings, len(server_settings))
    assert "http2-settings" not in head.headers  # not kept past the switch


def test_a_101_after_100_continue_in_the_same_write_switches_at_the_right_byte():
    s, _ = session_with(upgrade_request())
    rest = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"  # a SETTINGS ack
    (switch,) = write(s, b"HTTP/1.1 100 Continue\r\n\r\n" + switching() + rest)
    assert switch.handover.rest == rest and switch.handover.rest_length == len(rest)


def test_a_101_written_alone_hands_over_no_bytes():
    s, _ = session_with(upgrade_request())
    (switch,) = write(s, switching())
    assert (switch.handover.rest, switch.handover.rest_length) == (b"", 0)


def _not_switched(events):
    assert not any(isinstance(e, SwitchProtocol) for e in events), events
    finished, error = events
    assert isinstance(finished, RequestFinished) and (finished.stream, finished.status) == (0, 101)
    assert isinstance(error, ProtocolError) and error.counter == "connections_upgraded"
    assert error.level == logging.INFO and "h2c" in error.message


def test_a_websocket_101_ends_the_request_with_101_and_the_connection_is_not_followed():
    s, _ = session_with(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    _not_switched(write(s, switching(b"websocket") + b"\x81\x05hello"))


def test_h2c_asked_but_the_101_names_another_protocol_is_not_switched():
    s, _ = session_with(upgrade_request(upgrade=b"h2c, websocket"))
    _not_switched(write(s, switching(b"websocket")))


def test_a_101_naming_h2c_to_a_request_that_did_not_ask_for_it_is_not_switched():
    s, _ = session_with(upgrade_request(upgrade=b"websocket"))
    _not_switched(write(s, switching(b"h2c")))


def test_h2c_with_http2_settings_that_are_not_settings_is_not_switched():
    s, _ = session_with(upgrade_request(settings=b"AAEAAB"))  # 4 bytes: not whole 6-byte settings
    _not_switched(write(s, switching()))
    s, _ = session_with(upgrade_request(settings=b"!!not-base64!!"))
    _not_switched(write(s, switching()))


def test_a_101_head_cut_by_the_probes_copy_is_a_counted_error_not_a_guess():
    s, _ = session_with(upgrade_request())
    head = b"HTTP/1.1 101 Switching Protocols\r\nX-Pad: " + b"a" * 1100 + b"\r\nUpgrade: h2c\r\n\r\n"
    (error,) = write(s, head)
    assert isinstance(error, ProtocolError) and error.counter == "http_response_errors"
