"""Oblivious HTTP (RFC 9458) message encapsulation for the one HPKE suite of spec-v2.md §4.

Client (device) and gateway (service) exchange one request and its response::

    enc_request, client_ctx = encapsulate_request(config, bhttp_request)      # client, RFC 9458 §4.3
    bhttp_request, gateway_ctx = decapsulate_request(gateway_key, enc_request)  # gateway, §4.3
    enc_response = gateway_ctx.seal_response(bhttp_response)                  # gateway, §4.4
    bhttp_response = client_ctx.open_response(enc_response)                   # client, §4.4

A relay between them sees only ``key_id``, the suite ids and ciphertext. The response key is exported from the
request's HPKE context and salted with the request's ``enc``, so a response opens only under the context of the
request it answers. Failures raise :class:`OHTTPError` (a :class:`~hybriddp.core.errors.DataError`): an unknown
key id or suite (:class:`UnknownKeyError`), a malformed message, or one that does not decrypt (:class:`DecryptError`).

Per request the gateway does one ECDH, about a dozen HMAC-SHA256 calls and two AES-128-GCM operations.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from hybriddp.core import hpke
from hybriddp.core.errors import DataError

REQUEST_MEDIA_TYPE = "message/ohttp-req"  # RFC 9458 §9.1
RESPONSE_MEDIA_TYPE = "message/ohttp-res"  # §9.2
KEYS_MEDIA_TYPE = "application/ohttp-keys"  # §9.3

KEM_ID, KDF_ID, AEAD_ID = hpke.KEM_ID, hpke.KDF_ID, hpke.AEAD_ID
REQUEST_LABEL = b"message/bhttp request"  # §4.3, for binary HTTP inner messages
RESPONSE_LABEL = b"message/bhttp response"  # §4.4
RESPONSE_NONCE_LEN = max(hpke.N_N, hpke.N_K)  # 16
_HDR_LEN = 7  # key_id (1) || kem_id (2) || kdf_id (2) || aead_id (2)


class OHTTPError(DataError):
    """An OHTTP message or key configuration is malformed or cannot be processed."""


class UnknownKeyError(OHTTPError):
    """An encapsulated request names a key id or an HPKE suite the gateway does not have (RFC 9458 §4.3)."""


class DecryptError(OHTTPError):
    """An encapsulated request or response does not decrypt: tampered, or for another key or request."""


# ----- key configurations (RFC 9458 §3) ------------------------------------------------------------------


def _header(key_id: int, kem_id: int = KEM_ID, kdf_id: int = KDF_ID, aead_id: int = AEAD_ID) -> bytes:
    return bytes([key_id]) + kem_id.to_bytes(2, "big") + kdf_id.to_bytes(2, "big") + aead_id.to_bytes(2, "big")


@dataclass(frozen=True)
class KeyConfig:
    """One key configuration (RFC 9458 §3.1) with one symmetric suite (spec-v2.md §4).

    Wire form: ``key_id (1) || kem_id (2) || public_key (65) || 0x0004 || kdf_id (2) || aead_id (2)`` (74 bytes).
    """

    key_id: int
    public_key: bytes
    kem_id: int = KEM_ID
    kdf_id: int = KDF_ID
    aead_id: int = AEAD_ID

    def __post_init__(self) -> None:
        if not 0 <= self.key_id <= 255:
            raise OHTTPError(f"an OHTTP key id is one byte, 0..255; got {self.key_id}")
        if self.kem_id != KEM_ID:
            raise UnknownKeyError(f"KEM 0x{self.kem_id:04x} is not supported (only DHKEM(P-256) 0x{KEM_ID:04x})")
        hpke.deserialize_public_key(self.public_key)  # a point on P-256, or HPKEError

    @property
    def supported(self) -> bool:
        """Whether the suite is spec-v2's: HKDF-SHA256 and AES-128-GCM."""
        return (self.kdf_id, self.aead_id) == (KDF_ID, AEAD_ID)

    def header(self) -> bytes:
        """``hdr`` of RFC 9458 §4.3: key_id || kem_id || kdf_id || aead_id."""
        return _header(self.key_id, self.kem_id, self.kdf_id, self.aead_id)

    def to_bytes(self) -> bytes:
        """The RFC 9458 §3.1 encoding (one symmetric suite)."""
        return (bytes([self.key_id]) + self.kem_id.to_bytes(2, "big") + bytes(self.public_key)
                + (4).to_bytes(2, "big") + self.kdf_id.to_bytes(2, "big") + self.aead_id.to_bytes(2, "big"))

    serialize = to_bytes

    @classmethod
    def parse(cls, data: bytes) -> KeyConfig:
        """Read one RFC 9458 §3.1 key configuration; the whole of ``data`` must be it.

        A config listing several symmetric suites yields spec-v2's suite when listed, else its first one
        (:attr:`supported` then says False). An unknown KEM raises :class:`UnknownKeyError` (its key size
        is unknown); anything malformed raises :class:`OHTTPError`.
        """
        data = bytes(data)
        if len(data) < 3:
            raise OHTTPError(f"an OHTTP key config of {len(data)} bytes is truncated")
        kem_id = int.from_bytes(data[1:3], "big")
        if kem_id != KEM_ID:
            raise UnknownKeyError(f"OHTTP key config {data[0]} uses KEM 0x{kem_id:04x}; only DHKEM(P-256) "
                                  f"0x{KEM_ID:04x} is supported")
        end_pk = 3 + hpke.N_PK
        if len(data) < end_pk + 2:
            raise OHTTPError(f"an OHTTP key config of {len(data)} bytes is truncated")
        suites_len = int.from_bytes(data[end_pk:end_pk + 2], "big")
        suites = data[end_pk + 2:]
        if suites_len < 4 or suites_len % 4 or suites_len != len(suites):
            raise OHTTPError(f"OHTTP key config symmetric-algorithms length {suites_len} is not a positive "
                             f"multiple of 4 equal to the {len(suites)} bytes that follow (RFC 9458 §3.1)")
        pairs = [(int.from_bytes(suites[i:i + 2], "big"), int.from_bytes(suites[i + 2:i + 4], "big"))
                 for i in range(0, len(suites), 4)]
        kdf_id, aead_id = (KDF_ID, AEAD_ID) if (KDF_ID, AEAD_ID) in pairs else pairs[0]
        try:
            return cls(data[0], data[3:end_pk], kem_id, kdf_id, aead_id)
        except hpke.HPKEError as e:
            raise OHTTPError(f"OHTTP key config {data[0]}: {e}") from None

    from_bytes = parse


def encode_key_configs(configs: list[KeyConfig]) -> bytes:
    """The ``application/ohttp-keys`` body (RFC 9458 §3.2): each config prefixed by its 2-byte length."""
    out = bytearray()
    for config in configs:
        raw = config.to_bytes()
        out += len(raw).to_bytes(2, "big") + raw
    return bytes(out)


def parse_key_configs(data: bytes) -> list[KeyConfig]:
    """Read an ``application/ohttp-keys`` body (RFC 9458 §3.2).

    Configs whose KEM is not DHKEM(P-256) are skipped (a client uses what it supports); a malformed body,
    or one with no usable config, raises :class:`OHTTPError`.
    """
    data, pos, out = bytes(data), 0, []
    while pos < len(data):
        if pos + 2 > len(data):
            raise OHTTPError(f"application/ohttp-keys truncated at byte {pos}: a 2-byte length is missing")
        n = int.from_bytes(data[pos:pos + 2], "big")
        if pos + 2 + n > len(data):
            raise OHTTPError(f"application/ohttp-keys: config length {n} at byte {pos} runs past the end "
                             f"of the {len(data)}-byte body")
        try:
            out.append(KeyConfig.parse(data[pos + 2:pos + 2 + n]))
        except UnknownKeyError:
            pass
        pos += 2 + n
    if not out:
        raise OHTTPError("application/ohttp-keys holds no key config with DHKEM(P-256) (RFC 9458 §3.2)")
    return out


@dataclass(frozen=True)
class GatewayKey:
    """The gateway's private key and its key id: what decapsulates requests (RFC 9458 §3, §4.3).

    Stored with :meth:`to_bytes` (33 bytes: key_id || the 32-byte scalar of RFC 9180 §7.1.2).
    """

    key_id: int
    private_key: ec.EllipticCurvePrivateKey
    public_key: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.key_id <= 255:
            raise OHTTPError(f"an OHTTP key id is one byte, 0..255; got {self.key_id}")
        if not isinstance(self.private_key.curve, ec.SECP256R1):
            raise OHTTPError(f"the gateway key is on {self.private_key.curve.name}, not P-256")
        object.__setattr__(self, "public_key", hpke.serialize_public_key(self.private_key.public_key()))

    @classmethod
    def generate(cls, key_id: int = 1) -> GatewayKey:
        """A new key pair from the OS's randomness."""
        return cls(key_id, hpke.generate_key_pair())

    @property
    def config(self) -> KeyConfig:
        """The public key configuration to publish (``GET /ohttp-keys``, the head list's ``ohttp_key``)."""
        return KeyConfig(self.key_id, self.public_key)

    def to_bytes(self) -> bytes:
        """``key_id (1) || private scalar (32)``: secret, store it as such."""
        return bytes([self.key_id]) + hpke.serialize_private_key(self.private_key)

    def pkcs8(self) -> bytes:
        """The private key as unencrypted PKCS#8 DER (the key id is not in it)."""
        return self.private_key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption())

    @classmethod
    def from_bytes(cls, data: bytes, key_id: int | None = None) -> GatewayKey:
        """Read :meth:`to_bytes` output (33 bytes), or a 32-byte scalar or PKCS#8 DER with ``key_id`` given."""
        data = bytes(data)
        if key_id is None:
            if len(data) != 1 + hpke.N_SK:
                raise OHTTPError(f"a stored gateway key is {1 + hpke.N_SK} bytes (key_id || scalar), got "
                                 f"{len(data)}; pass key_id= for a bare scalar or PKCS#8")
            return cls(data[0], hpke.deserialize_private_key(data[1:]))
        if len(data) == hpke.N_SK:
            return cls(key_id, hpke.deserialize_private_key(data))
        try:
            key = serialization.load_der_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise OHTTPError(f"the gateway key is neither a 32-byte scalar nor PKCS#8 DER: {e}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise OHTTPError(f"the PKCS#8 gateway key is a {type(key).__name__}, not a P-256 key")
        return cls(key_id, key)


# ----- encapsulation (RFC 9458 §4.3, §4.4) ---------------------------------------------------------------


def _response_aead(secret: bytes, enc: bytes, response_nonce: bytes) -> hpke.SenderContext:
    """RFC 9458 §4.4 steps 3–5: prk = Extract(enc || response_nonce, secret); key, nonce = Expand(prk, ...)."""
    prk = hpke.extract(enc + response_nonce, secret)
    return hpke.SenderContext(hpke.expand(prk, b"key", hpke.N_K), hpke.expand(prk, b"nonce", hpke.N_N), b"")


@dataclass
class ClientResponseContext:
    """What the client keeps of its request to open the response: the export secret and ``enc`` (§4.4)."""

    secret: bytes = field(repr=False)
    enc: bytes

    def open_response(self, enc_response: bytes) -> bytes:
        """Decrypt ``response_nonce || ct`` (RFC 9458 §4.4); raises :class:`DecryptError` unless the gateway
        sealed it for this very request."""
        enc_response = bytes(enc_response)
        if len(enc_response) < RESPONSE_NONCE_LEN + hpke.N_T:
            raise DecryptError(f"an encapsulated response is at least {RESPONSE_NONCE_LEN + hpke.N_T} bytes, "
                               f"got {len(enc_response)}")
        nonce, ct = enc_response[:RESPONSE_NONCE_LEN], enc_response[RESPONSE_NONCE_LEN:]
        ctx = _response_aead(self.secret, self.enc, nonce)
        try:
            return hpke.RecipientContext(ctx.key, ctx.base_nonce, b"").open(b"", ct)
        except hpke.OpenError:
            raise DecryptError("the OHTTP response does not decrypt: tampered, or not the answer to this "
                               "request") from None


@dataclass
class GatewayResponseContext:
    """What the gateway keeps of a request to seal its response: the export secret and ``enc`` (§4.4)."""

    secret: bytes = field(repr=False)
    enc: bytes

    def seal_response(self, response: bytes) -> bytes:
        """``response_nonce || Seal(aead_key, aead_nonce, "", response)`` (RFC 9458 §4.4), a fresh nonce each call."""
        nonce = secrets.token_bytes(RESPONSE_NONCE_LEN)
        return nonce + _response_aead(self.secret, self.enc, nonce).seal(b"", bytes(response))


def _info(hdr: bytes) -> bytes:
    return REQUEST_LABEL + b"\x00" + hdr  # RFC 9458 §4.3


def encapsulate_request(config: KeyConfig, request: bytes) -> tuple[bytes, ClientResponseContext]:
    """``hdr || enc || Seal("", request)`` for ``config``'s key (RFC 9458 §4.3), and the context to open the
    response with. Raises :class:`UnknownKeyError` when the config's suite is not spec-v2's."""
    if not config.supported:
        raise UnknownKeyError(f"OHTTP key config {config.key_id} offers KDF 0x{config.kdf_id:04x} / AEAD "
                              f"0x{config.aead_id:04x}; only HKDF-SHA256 / AES-128-GCM (0x0001 / 0x0001) is supported")
    hdr = config.header()
    enc, ctx = hpke.setup_base_s(config.public_key, _info(hdr))
    ct = ctx.seal(b"", bytes(request))
    return hdr + enc + ct, ClientResponseContext(ctx.export(RESPONSE_LABEL, RESPONSE_NONCE_LEN), enc)


def decapsulate_request(key: GatewayKey, enc_request: bytes) -> tuple[bytes, GatewayResponseContext]:
    """Open an encapsulated request (RFC 9458 §4.3) → ``(request, context to seal the response)``.

    Raises :class:`UnknownKeyError` for another key id or suite, :class:`OHTTPError` when malformed,
    :class:`DecryptError` when it does not decrypt.
    """
    enc_request = bytes(enc_request)
    if len(enc_request) < _HDR_LEN + hpke.N_ENC + hpke.N_T:
        raise OHTTPError(f"an encapsulated request is at least {_HDR_LEN + hpke.N_ENC + hpke.N_T} bytes, "
                         f"got {len(enc_request)}")
    hdr = enc_request[:_HDR_LEN]
    if hdr != _header(key.key_id):
        key_id, kem, kdf, aead = hdr[0], hdr[1:3].hex(), hdr[3:5].hex(), hdr[5:7].hex()
        raise UnknownKeyError(f"the OHTTP request is for key id {key_id} with KEM 0x{kem} / KDF 0x{kdf} / AEAD "
                              f"0x{aead}; this gateway has key id {key.key_id} with 0x0010 / 0x0001 / 0x0001")
    enc, ct = enc_request[_HDR_LEN:_HDR_LEN + hpke.N_ENC], enc_request[_HDR_LEN + hpke.N_ENC:]
    try:
        ctx = hpke.setup_base_r(enc, key.private_key, _info(hdr), pk_r_bytes=key.public_key)
        request = ctx.open(b"", ct)
    except hpke.OpenError:
        raise DecryptError("the OHTTP request does not decrypt under this gateway's key (tampered, or "
                           "sealed to another key)") from None
    except hpke.HPKEError as e:
        raise OHTTPError(f"the OHTTP request's encapsulated key is invalid: {e}") from None
    return request, GatewayResponseContext(ctx.export(RESPONSE_LABEL, RESPONSE_NONCE_LEN), enc)
