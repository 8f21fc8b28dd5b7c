"""Binary HTTP (:mod:`hybriddp.core.bhttp`, RFC 9292 known-length messages): the RFC's example encodings,
round trips, truncation exactly where §3.1 allows it, padding (§3.8), and refusal of everything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybriddp.core import bhttp
from hybriddp.core.bhttp import BHTTPError
from hybriddp.core.errors import DataError


def _hex(dump: str) -> bytes:
    return bytes.fromhex("".join(dump.split()))


# RFC 9292 §5.1, "Known-Length Binary Encoding of Request".
RFC_REQUEST = _hex("""
00034745 54056874 74707300 0a2f6865 6c6c6f2e 74787440 6c0a7573 65722d61 67656e74 34637572 6c2f372e 31362e33
206c6962 6375726c 2f372e31 362e3320 4f70656e 53534c2f 302e392e 376c207a 6c69622f 312e322e 3304686f 73740f77
77772e65 78616d70 6c652e63 6f6d0f61 63636570 742d6c61 6e677561 67650665 6e2c206d 690000""")
RFC_REQUEST_HEADERS = [("user-agent", "curl/7.16.3 libcurl/7.16.3 OpenSSL/0.9.7l zlib/1.2.3"),
                       ("host", "www.example.com"), ("accept-language", "en, mi")]
# RFC 9292 §5.1, "Indefinite-Length Binary Encoding of Request" (framing 2: refused here).
RFC_INDETERMINATE_REQUEST = _hex("""
02034745 54056874 74707300 0a2f6865 6c6c6f2e 7478740a 75736572 2d616765 6e743463 75726c2f 372e3136 2e33206c
69626375 726c2f37 2e31362e 33204f70 656e5353 4c2f302e 392e376c 207a6c69 622f312e 322e3304 686f7374 0f777777
2e657861 6d706c65 2e636f6d 0f616363 6570742d 6c616e67 75616765 06656e2c 206d6900 00000000 00000000 00000000""")
# RFC 9292 §5.2, "Known-Length Encoding of Response" (the chunked example: content and a trailer).
RFC_RESPONSE = _hex("""
0140c800 1d546869 7320636f 6e74656e 7420636f 6e746169 6e732043 524c462e 0d0a0d07 74726169 6c657204 74657874""")


def test_rfc_request_example() -> None:
    req = bhttp.decode_request(RFC_REQUEST)
    assert req == bhttp.Request("GET", "https", "", "/hello.txt", RFC_REQUEST_HEADERS, b"", [])
    assert req.header("Host") == "www.example.com" and req.header("cookie") is None
    assert bhttp.encode_request("GET", "https", "", "/hello.txt", RFC_REQUEST_HEADERS, b"") == RFC_REQUEST
    # §5.1: "the last two bytes - corresponding to content and a trailer section - can each be removed"
    assert bhttp.decode_request(RFC_REQUEST[:-1]) == req == bhttp.decode_request(RFC_REQUEST[:-2])
    assert bhttp.decode_request(RFC_REQUEST + bytes(10)) == req  # §3.8 padding


def test_rfc_response_example() -> None:
    resp = bhttp.decode_response(RFC_RESPONSE)
    assert resp == bhttp.Response(200, [], b"This content contains CRLF.\r\n", [("trailer", "text")])
    assert bhttp.encode_response(200, [], b"This content contains CRLF.\r\n",
                                 trailers=[("trailer", "text")]) == RFC_RESPONSE


def test_indeterminate_length_framing_is_refused() -> None:
    with pytest.raises(BHTTPError, match=r"framing indicator 2 \(an indeterminate-length request\)"):
        bhttp.decode_request(RFC_INDETERMINATE_REQUEST)
    with pytest.raises(BHTTPError, match="framing indicator 3"):
        bhttp.decode_response(b"\x03\x40\xc8\x00\x00\x00")
    with pytest.raises(BHTTPError, match="framing indicator 1"):
        bhttp.decode_request(RFC_RESPONSE)
    with pytest.raises(BHTTPError, match="framing indicator 0"):
        bhttp.decode_response(RFC_REQUEST)
    with pytest.raises(BHTTPError, match="unknown"):
        bhttp.decode_request(b"\x05")


def test_informational_responses_are_skipped() -> None:
    """RFC 9292 §3.5.1: 102 and 103 (the §5.2 example's interim responses, known-length) come before 200."""
    section = bhttp.encode_response(200, [("running", '"sleep 15"')], b"")[3:-2]  # the header section alone
    links = bhttp.encode_response(200, [("link", "</style.css>; rel=preload; as=style")], b"")[3:-2]
    final = bhttp.encode_response(200, [("server", "Apache")], b"Hello World!")
    data = b"\x01" + bhttp.encode_varint(102) + section + bhttp.encode_varint(103) + links + final[1:]
    assert bhttp.decode_response(data) == bhttp.Response(200, [("server", "Apache")], b"Hello World!")
    with pytest.raises(BHTTPError, match="response status is missing"):
        bhttp.decode_response(b"\x01" + bhttp.encode_varint(103) + links)  # no final response


@pytest.mark.parametrize(("encoded", "value"), [
    ("c2197c5eff14e88c", 151288809941952652), ("9d7f3e7d", 494878333), ("7bbd", 15293), ("25", 37),
])
def test_varints_rfc_9000_appendix_a1(encoded: str, value: int) -> None:
    assert bhttp.encode_varint(value).hex() == encoded
    assert bhttp.decode_varint(bytes.fromhex(encoded)) == (value, len(encoded) // 2)


def test_varint_bounds() -> None:
    assert bhttp.decode_varint(b"\x40\x25") == (37, 2)  # RFC 9000 §16: not the shortest, still 37
    assert bhttp.encode_varint(2**62 - 1) == b"\xff" * 8
    for bad in (-1, 2**62):
        with pytest.raises(BHTTPError):
            bhttp.encode_varint(bad)
    with pytest.raises(BHTTPError, match="needs 8 bytes"):
        bhttp.decode_varint(b"\xc0\x00")


_token = st.text(alphabet="!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12)
_value = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0xFF, exclude_characters="\x7f"),
                 max_size=20).flatmap(lambda v: st.sampled_from([v, f"{v} {v}" if v else v]))
_fields = st.lists(st.tuples(_token, _value), max_size=5)
_visible = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(method=_token.map(str.upper), scheme=st.sampled_from(["https", "http"]),
       authority=st.sampled_from(["", "example.com", "[::1]:8080"]), path=_visible, headers=_fields,
       content=st.binary(max_size=300), trailers=_fields, padding=st.integers(0, 5))
def test_request_round_trip_and_truncation(method: str, scheme: str, authority: str, path: str,
                                           headers: list[tuple[str, str]], content: bytes,
                                           trailers: list[tuple[str, str]], padding: int) -> None:
    """Round trip; and every prefix is refused except the cut points §3.1 allows (before a section's length)."""
    data = bhttp.encode_request(method, scheme, authority, path, headers, content, trailers=trailers)
    want = bhttp.Request(method, scheme, authority, path, headers, content, trailers)
    assert bhttp.decode_request(data + bytes(padding)) == want
    control_end = len(bhttp.encode_request(method, scheme, authority, path, [], b"")) - 3
    headers_end = len(bhttp.encode_request(method, scheme, authority, path, headers, b"")) - 2
    content_end = len(bhttp.encode_request(method, scheme, authority, path, headers, content)) - 1
    allowed = {control_end: (0, 0, 0), headers_end: (1, 0, 0), content_end: (1, 1, 0)}
    for cut in range(len(data)):
        if cut in allowed:
            got = bhttp.decode_request(data[:cut])
            keep_h, keep_c, _ = allowed[cut]
            assert got == bhttp.Request(method, scheme, authority, path, headers if keep_h else [],
                                        content if keep_c else b"", [])
        else:
            with pytest.raises(BHTTPError):
                bhttp.decode_request(data[:cut])


@settings(max_examples=200, deadline=None)
@given(status=st.integers(200, 599), headers=_fields, content=st.binary(max_size=300), trailers=_fields)
def test_response_round_trip(status: int, headers: list[tuple[str, str]], content: bytes,
                             trailers: list[tuple[str, str]]) -> None:
    data = bhttp.encode_response(status, headers, content, trailers=trailers)
    assert bhttp.decode_response(data) == bhttp.Response(status, headers, content, trailers)
    assert bhttp.decode_response(data + bytes(7)) == bhttp.Response(status, headers, content, trailers)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_bhttp_error(data: bytes) -> None:
    for decode in (bhttp.decode_request, bhttp.decode_response):
        try:
            decode(data)
        except BHTTPError:
            pass


def _request(**overrides: object) -> bytes:
    args: dict[str, object] = {"method": "POST", "scheme": "https", "authority": "", "path": "/x",
                               "headers": [("content-type", "application/json")], "content": b"{}"}
    args.update(overrides)
    return bhttp.encode_request(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("data", "message"), [
    (b"", "framing indicator is missing"),
    (b"\x00\x04POST", "length of the request scheme is missing"),
    (b"\x00\x04PO", "method length 4 at byte 2 runs past the end"),
    (_request() + b"\x00\x01", "not zero padding"),
    (_request()[:-4] + b"\xbf\xff\xff\xff" + _request()[-3:], "content length 1073741823 .* runs past the end"),
    (_request()[:-4] + b"\xff" * 8, "content length 4611686018427387903"),
    (b"\x00\x04POST\x05https\x00\x02/x\x09\x07:method\x00", "pseudo-field ':method'"),
    (b"\x00\x04POST\x05https\x00\x02/x\x05\x02Ab\x01c", "field name b'Ab' is not a lower-case"),
    (b"\x00\x04POST\x05https\x00\x02/x\x03\x00\x01c", "field name b'' is not"),
    (b"\x00\x04POST\x05https\x00\x02/x\x05\x01a\x02c\r", "holds NUL, CR or LF"),
    (b"\x00\x04POST\x05https\x00\x02/x\x05\x01a\x02 c", "starts or ends with whitespace"),
    (b"\x00\x04POST\x05https\x00\x02/x\x04\x01a\x05c", "value of field b'a' .* runs past the end"),
    (b"\x00\x00\x05https\x00\x02/x", "method '' is empty"),
    (b"\x00\x04P T\x05https\x00\x02/x", "holds a space"),
    (b"\x00\x04POST\x05https\x00\x02/\xff", "not ASCII"),
])
def test_malformed_requests_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(BHTTPError, match=message):
        bhttp.decode_request(data)


@pytest.mark.parametrize(("data", "message"), [
    (b"\x01", "status is missing"),
    (b"\x01\x40\x63\x00\x00\x00", "status 99 is not 100..599"),
    (b"\x01\x42\x58\x00\x00\x00", "status 600"),
    (b"\x01\x40\xc8\x00\x05ab", "content length 5 .* runs past the end"),
])
def test_malformed_responses_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(BHTTPError, match=message):
        bhttp.decode_response(data)


def test_size_bound_and_error_family() -> None:
    data = _request(content=bytes(1000))
    assert bhttp.decode_request(data, max_size=len(data)).content == bytes(1000)
    with pytest.raises(BHTTPError, match="over the 1000-byte limit"):
        bhttp.decode_request(data, max_size=1000)
    with pytest.raises(BHTTPError, match="over the"):
        bhttp.decode_response(bhttp.encode_response(200, [], bytes(100)), max_size=50)
    assert issubclass(BHTTPError, DataError)


def test_encoders_refuse_what_decoders_would() -> None:
    assert bhttp.decode_request(_request(headers=[("Content-Type", "a")])).headers == [("content-type", "a")]
    for bad in ([(":path", "/")], [("", "x")], [("a b", "x")], [("a", "x\ny")], [("a", " x")], [("a", "€")],
                [("é", "x")]):
        with pytest.raises(BHTTPError):
            _request(headers=bad)
    for field, value in (("method", ""), ("method", "G T"), ("scheme", ""), ("path", ""), ("path", "/é"),
                         ("authority", "a b")):
        with pytest.raises(BHTTPError):
            _request(**{field: value})
    for status in (100, 199, 600, 0, True):
        with pytest.raises(BHTTPError, match=r"200\.\.599"):
            bhttp.encode_response(status, [], b"")  # type: ignore[arg-type]
