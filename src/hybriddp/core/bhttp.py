"""Binary HTTP messages (RFC 9292), known-length form only: the inner messages of OHTTP (spec-v2.md §4).

A request is ``0 (framing) || method || scheme || authority || path || header section || content || trailer
section || padding`` and a response ``1 || status || header section || content || trailer section || padding``
(RFC 9292 §3.1–§3.8), every string and section prefixed by its length as a variable-length integer (RFC 9000
§16). Field names are sent in lower case (§3.6, after HTTP/2); field values are bytes, carried here as Latin-1
``str`` (lossless, the way ASGI servers decode them).

The decoders are strict and bounded. They refuse (:class:`BHTTPError`, naming what is wrong and where):
indeterminate-length framing (2, 3) and unknown framing; truncation anywhere except where §3.1 allows it
(before a section's length prefix: a missing section is an empty one); a length past the end of the input;
input over ``max_size`` bytes; non-zero padding (§3.8); pseudo-fields, empty or invalid field names, and values
HTTP/2 would reject (§3.6). Informational (1xx) responses before the final one are parsed and skipped (§3.5.1):
they carry nothing the gateway or the device uses.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hybriddp.core.errors import DataError

FRAMING_KNOWN_REQUEST = 0  # RFC 9292 §3.3
FRAMING_KNOWN_RESPONSE = 1
MEDIA_TYPE = "message/bhttp"  # §6
MAX_VARINT = (1 << 62) - 1  # RFC 9000 §16
MAX_SIZE = 64 << 20
"""Default bound on a decoded message, bytes (a head list is the largest thing carried)."""

Fields = list[tuple[str, str]]

_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+")
"""A field name (fullmatch): one or more token characters (RFC 9110 §5.6.2), lower case."""
_BAD_IN_VALUE = re.compile(rb"[\x00\n\r]")
_BAD_IN_CONTROL = re.compile(rb"[\x00-\x20\x7f]")

What = str | Callable[[], str]
"""What a read is for, in an error message: the text, or a function making it (only called on an error)."""


class BHTTPError(DataError):
    """A binary HTTP message is malformed, truncated, too large, or not a known-length message."""


@dataclass(frozen=True)
class Request:
    """A decoded request (RFC 9292 §3.4): control data, header fields, content, trailer fields."""

    method: str
    scheme: str
    authority: str
    path: str
    headers: Fields
    content: bytes
    trailers: Fields = field(default_factory=list)

    def header(self, name: str) -> str | None:
        """The first value of header field ``name`` (case-insensitive), or None."""
        return _first(self.headers, name)


@dataclass(frozen=True)
class Response:
    """A decoded final response (RFC 9292 §3.5): status 200..599, header fields, content, trailer fields."""

    status: int
    headers: Fields
    content: bytes
    trailers: Fields = field(default_factory=list)

    def header(self, name: str) -> str | None:
        """The first value of header field ``name`` (case-insensitive), or None."""
        return _first(self.headers, name)


def _first(fields: Fields, name: str) -> str | None:
    name = name.lower()
    return next((v for n, v in fields if n == name), None)


# ----- variable-length integers (RFC 9000 §16) -----------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """The shortest RFC 9000 §16 encoding of ``value`` (0 ≤ value < 2^62): 1, 2, 4 or 8 bytes."""
    if 0 <= value < 0x40:  # the common cases first: a length or status in 1 or 2 bytes
        return bytes((value,))
    if 0 <= value < 0x4000:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 0 or value > MAX_VARINT:
        raise BHTTPError(f"{value} cannot be a variable-length integer: it must be 0..2^62-1")
    for size, prefix in ((1, 0x00), (2, 0x40), (4, 0x80), (8, 0xC0)):
        if value < 1 << (8 * size - 2):
            out = bytearray(value.to_bytes(size, "big"))
            out[0] |= prefix
            return bytes(out)
    raise AssertionError("unreachable")  # pragma: no cover


def decode_varint(data: bytes, pos: int = 0) -> tuple[int, int]:
    """One RFC 9000 §16 integer at ``data[pos:]`` → ``(value, position after it)``; :class:`BHTTPError` if cut."""
    reader = _Reader(bytes(data))
    reader.pos = pos
    return reader.varint("a variable-length integer"), reader.pos


class _Reader:
    """A cursor over ``data`` whose every read is bounds-checked and names the part being read."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def varint(self, what: What) -> int:
        """One RFC 9000 §16 integer (non-shortest encodings are accepted, as §16 allows)."""
        if self.at_end():
            raise BHTTPError(f"binary HTTP message truncated at byte {self.pos}: {_text(what)} is missing")
        first = self.data[self.pos]
        if first < 0x40:
            self.pos += 1
            return first
        size = 1 << (first >> 6)
        if self.pos + size > len(self.data):
            raise BHTTPError(f"binary HTTP message truncated at byte {self.pos}: {_text(what)} needs {size} bytes")
        raw = bytearray(self.data[self.pos:self.pos + size])
        raw[0] &= 0x3F
        self.pos += size
        return int.from_bytes(raw, "big")

    def take(self, n: int, what: What) -> bytes:
        if n > len(self.data) - self.pos:
            raise BHTTPError(f"binary HTTP {_text(what)} length {n} at byte {self.pos} runs past the end of the "
                             f"{len(self.data)}-byte message")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def prefixed(self, what: What) -> bytes:
        return self.take(self.varint(lambda: f"the length of {_text(what)}"), what)


def _text(what: What) -> str:
    return what if isinstance(what, str) else what()


# ----- encoding ------------------------------------------------------------------------------------------


def _prefixed(data: bytes) -> bytes:
    return encode_varint(len(data)) + data


def _ascii(value: str, what: str, *, empty: bool = True) -> bytes:
    try:
        raw = value.encode("ascii")
    except UnicodeEncodeError:
        raise BHTTPError(f"the request {what} {value!r} is not ASCII") from None
    if (not raw and not empty) or _BAD_IN_CONTROL.search(raw):
        raise BHTTPError(f"the request {what} {value!r} is empty or holds a space or control character")
    return raw


def _check_name(name: bytes) -> None:
    if not _NAME.fullmatch(name):
        raise BHTTPError(f"field name {name!r} is not a lower-case HTTP token (RFC 9292 §3.6, RFC 9113 §8.2.1)")


def _check_value(name: bytes, value: bytes) -> None:
    if _BAD_IN_VALUE.search(value) or value[:1] in (b" ", b"\t") or value[-1:] in (b" ", b"\t"):
        raise BHTTPError(f"the value of field {name.decode()!r} holds NUL, CR or LF or starts or ends with "
                         f"whitespace (RFC 9292 §3.6, RFC 9113 §8.2.1)")


def _field_section(fields: Iterable[tuple[str, str]], memo: bool = False) -> bytes:
    """The field section of ``fields``; ``memo``: from :func:`_section`'s cache (a response's headers only: a
    request's may carry a credential, which no cache should keep)."""
    section = tuple(fields)
    return _section(section) if memo and len(section) <= _MEMO_FIELDS else _section.__wrapped__(section)


_MEMO_FIELDS = 16
"""Response field sections of at most this many fields are memoized (:func:`_section`)."""


@functools.lru_cache(maxsize=256)
def _section(fields: tuple[tuple[str, str], ...]) -> bytes:
    """The encoded, checked field section of ``fields``; memoized, since a server's answers repeat a few header
    sets (an OHTTP gateway encodes one per relayed report)."""
    out = bytearray()
    for name, value in fields:
        try:
            raw_name, raw_value = name.lower().encode("ascii"), value.encode("latin-1")
        except UnicodeEncodeError:
            raise BHTTPError(f"field {name!r} has a name that is not ASCII or a value that is not "
                             f"Latin-1") from None
        _check_name(raw_name)
        _check_value(raw_name, raw_value)
        out += _prefixed(raw_name) + _prefixed(raw_value)
    return _prefixed(bytes(out))


def encode_request(method: str, scheme: str, authority: str, path: str, headers: Iterable[tuple[str, str]],
                   content: bytes, *, trailers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A known-length request (RFC 9292 §3.1, framing 0), without padding or truncation.

    ``authority`` may be empty (§3.4: it stands for an absent ``:authority``); header names are lower-cased.
    """
    return (encode_varint(FRAMING_KNOWN_REQUEST) + _prefixed(_ascii(method, "method", empty=False))
            + _prefixed(_ascii(scheme, "scheme", empty=False)) + _prefixed(_ascii(authority, "authority"))
            + _prefixed(_ascii(path, "path", empty=False)) + _field_section(headers) + _prefixed(bytes(content))
            + _field_section(trailers))


def encode_response(status: int, headers: Iterable[tuple[str, str]], content: bytes, *,
                    trailers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A known-length final response (RFC 9292 §3.1, framing 1), status 200..599, no informational responses."""
    if not isinstance(status, int) or not 200 <= status <= 599:
        raise BHTTPError(f"a final response status must be 200..599 (RFC 9292 §3.5), got {status!r}")
    return (encode_varint(FRAMING_KNOWN_RESPONSE) + encode_varint(status) + _field_section(headers, memo=True)
            + _prefixed(bytes(content)) + _field_section(trailers))


# ----- decoding ------------------------------------------------------------------------------------------


def _start(data: bytes, expected: int, max_size: int) -> _Reader:
    data = bytes(data)
    if len(data) > max_size:
        raise BHTTPError(f"binary HTTP message of {len(data)} bytes is over the {max_size}-byte limit")
    reader = _Reader(data)
    framing = reader.varint("the framing indicator")
    if framing != expected:
        kinds = {0: "a known-length request", 1: "a known-length response", 2: "an indeterminate-length request",
                 3: "an indeterminate-length response"}
        raise BHTTPError(f"binary HTTP framing indicator {framing} ({kinds.get(framing, 'unknown')}): only "
                         f"{kinds[expected]} (framing {expected}) is accepted")
    return reader


def _read_fields(reader: _Reader, what: str) -> Fields:
    """A known-length field section; at the end of input it is empty (truncation, RFC 9292 §3.1)."""
    if reader.at_end():
        return []
    section = _Reader(reader.prefixed(what))
    fields: Fields = []
    while not section.at_end():
        name = section.prefixed(lambda: f"a field name in the {what}")
        value = section.prefixed(lambda name=name: f"the value of field {name[:64]!r} in the {what}")
        if name.startswith(b":"):
            raise BHTTPError(f"pseudo-field {name.decode('latin-1')!r} in the {what} (RFC 9292 §4 makes it invalid)")
        _check_name(name)
        _check_value(name, value)
        fields.append((name.decode("ascii"), value.decode("latin-1")))
    return fields


def _read_rest(reader: _Reader, what: str) -> tuple[Fields, bytes, Fields]:
    headers = _read_fields(reader, f"{what} header section")
    content = b"" if reader.at_end() else reader.prefixed(f"{what} content")
    trailers = _read_fields(reader, f"{what} trailer section")
    padding = reader.data[reader.pos:]
    if padding.count(0) != len(padding):
        raise BHTTPError(f"the {len(padding)} bytes after the {what} trailer section are not zero padding "
                         "(RFC 9292 §3.8)")
    return headers, content, trailers


def _control(reader: _Reader, what: str, *, empty: bool = True) -> str:
    raw = reader.prefixed(f"the request {what}")
    try:
        return _ascii(raw.decode("ascii"), what, empty=empty).decode("ascii")
    except UnicodeDecodeError:
        raise BHTTPError(f"the request {what} {raw[:64]!r} is not ASCII") from None


def decode_request(data: bytes, *, max_size: int = MAX_SIZE) -> Request:
    """Parse a known-length binary HTTP request (RFC 9292 §3.1, §3.4); raises :class:`BHTTPError` if invalid."""
    reader = _start(data, FRAMING_KNOWN_REQUEST, max_size)
    method = _control(reader, "method", empty=False)
    scheme = _control(reader, "scheme", empty=False)
    authority = _control(reader, "authority")
    path = _control(reader, "path", empty=False)
    headers, content, trailers = _read_rest(reader, "request")
    return Request(method, scheme, authority, path, headers, content, trailers)


def decode_response(data: bytes, *, max_size: int = MAX_SIZE) -> Response:
    """Parse a known-length binary HTTP response (RFC 9292 §3.1, §3.5); raises :class:`BHTTPError` if invalid.

    Informational responses (status 100..199, §3.5.1) before the final one are skipped.
    """
    reader = _start(data, FRAMING_KNOWN_RESPONSE, max_size)
    while True:
        status = reader.varint("the response status")
        if 100 <= status <= 199:
            _read_fields(reader, f"informational {status} response header section")
            continue
        if not 200 <= status <= 599:
            raise BHTTPError(f"binary HTTP response status {status} is not 100..599 (RFC 9292 §3.5)")
        headers, content, trailers = _read_rest(reader, "response")
        return Response(status, headers, content, trailers)
