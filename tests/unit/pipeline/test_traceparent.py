"""W3C traceparent parsing."""
import pytest

from otel_gpu.pipeline.traceparent import parse_traceparent

TID = "4bf92f3577b34da6a3ce929d0e0e4736"
SID = "00f067aa0ba902b7"


def test_valid_version_00():
    assert parse_traceparent(f"00-{TID}-{SID}-01") == (int(TID, 16), int(SID, 16))


def test_unsampled_flags_still_parse():
    assert parse_traceparent(f"00-{TID}-{SID}-00") == (int(TID, 16), int(SID, 16))


def test_surrounding_whitespace_ignored():
    assert parse_traceparent(f"  00-{TID}-{SID}-01 ") == (int(TID, 16), int(SID, 16))


def test_future_version_with_extra_fields_accepted():
    assert parse_traceparent(f"cc-{TID}-{SID}-01-what-the-future-holds") == (int(TID, 16), int(SID, 16))


def test_uppercase_hex_is_accepted_leniently():
    # The W3C grammar says lower-case hex; the parser lower-cases first (lenient).
    assert parse_traceparent(f"00-{TID.upper()}-{SID.upper()}-01") == (int(TID, 16), int(SID, 16))


@pytest.mark.parametrize("value", [
    None, "", "   ",
    f"ff-{TID}-{SID}-01",                 # version ff is invalid
    f"00-{'0' * 32}-{SID}-01",            # zero trace id
    f"00-{TID}-{'0' * 16}-01",            # zero span id
    f"00-{TID}-{SID}-01-extra",           # version 00 has exactly four fields
    f"00-{TID[:-1]}-{SID}-01",            # short trace id
    f"00-{TID}-{SID}0-01",                # long span id
    f"00-{TID[:-1]}g-{SID}-01",           # non-hex
    f"00_{TID}_{SID}_01",
    f"0-{TID}-{SID}-01",
    f"00-{TID}-{SID}",
    "garbage", "\x00\xff", "00-" * 20,
])
def test_invalid_values_start_a_new_trace(value):
    assert parse_traceparent(value) is None


def test_the_sampled_flag():
    from otel_gpu.pipeline.traceparent import traceparent_sampled
    assert traceparent_sampled(f"00-{TID}-{SID}-01") is True
    assert traceparent_sampled(f"00-{TID}-{SID}-00") is False
    assert traceparent_sampled(f"00-{TID}-{SID}-03") is True  # other flag bits: ignored
    assert traceparent_sampled(f"00-{TID}-{'0' * 16}-01") is None and traceparent_sampled(None) is None
