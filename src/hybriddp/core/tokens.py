"""Anonymous one-message report tokens: Privacy Pass publicly verifiable tokens (RFC 9578 §6) bound to a report.

A device admitted to a round (docs/TOKENS.md) obtains one token per message it sends:

1. It makes its message first (the randomized report and a fresh random message id), then derives the
   token's ``nonce`` from it: ``nonce = SHA-256("hybriddp report token v1" 0x00 || message id 0x00 ||
   payload)``, the payload being the reports' (query, url) pairs or the mean value (:func:`blender_payload`,
   :func:`mean_payload`).
2. It blinds ``token_input = 0x0002 || nonce || SHA-256(TokenChallenge) || token_key_id`` (RFC 9578 §6.1,
   the challenge naming the round: :func:`challenge`) under the round's public key and sends only the
   blinded message to the issuance endpoint with its device credential (:class:`TokenRequest`).
3. The server signs it blind (:func:`issue`, RFC 9474 §4.3); the device unblinds the answer into the
   token's ``authenticator``, a standard RSASSA-PSS signature, and sends it in the message's ``"token"``.
4. The reports endpoint recomputes ``token_input`` from the message and verifies the authenticator
   (:class:`TokenVerifier`).

Guarantees. The issuer sees only a blinded message, uniformly distributed whatever the token, so no
record of the issuance can be matched to the report it later signs (RFC 9474 §7.3). The token is bound to
the message: a retry of the same message (same id, same reports) re-sends the same token and is
deduplicated by its id; the token verifies for no other message, so it is spent by exactly one message.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from hybriddp.core import blindrsa
from hybriddp.core.errors import DataError

TOKEN_TYPE = 0x0002
"""Privacy Pass publicly verifiable token type (RFC 9578 §6): RSABSSA-SHA384-PSS-Deterministic, 2048-bit keys."""
KEY_BITS = 2048
ISSUER_NAME = b"hybriddp"
"""The TokenChallenge's issuer_name."""
NONCE_DOMAIN = b"hybriddp report token v1\x00"
VARIANT = blindrsa.TOKEN_TYPE_2_VARIANT
AUTHENTICATOR_BYTES = KEY_BITS // 8
_NULL_URL = 0xFFFFFFFF


class TokenError(DataError):
    """A message without a valid report token for it (the service answers 403 with ``code``)."""

    def __init__(self, message: str, code: str = "token_invalid") -> None:
        super().__init__(message)
        self.code = code


def b64(data: bytes) -> str:
    """URL-safe base64 without padding (how every token field travels in JSON)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(text: Any, field: str, size: int | None = None) -> bytes:
    """The bytes of a URL-safe base64 field (padding optional); a :class:`DataError` naming the field otherwise."""
    if not isinstance(text, str) or len(text) > 4 * (size or 4096):
        raise DataError(f"field {field!r} must be a URL-safe base64 string"
                        + (f" of {size} bytes" if size else "") + f", found {type(text).__name__}")
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise DataError(f"field {field!r} is not URL-safe base64 ({text[:20]!r}…)") from None
    if size is not None and len(data) != size:
        raise DataError(f"field {field!r} must hold {size} bytes, found {len(data)}")
    return data


# ----- what a token is bound to --------------------------------------------------------------------
def challenge(round_id: str) -> bytes:
    """The round's TokenChallenge (RFC 9578 §2.1): type, issuer name, redemption context SHA-256(round id),
    empty origin info. Its SHA-256 goes into every token of the round."""
    context = hashlib.sha256(round_id.encode("ascii")).digest()
    return (struct.pack(">HH", TOKEN_TYPE, len(ISSUER_NAME)) + ISSUER_NAME + bytes([len(context)]) + context
            + struct.pack(">H", 0))


def blender_payload(reports: Sequence[Any]) -> bytes:
    """The reports of a BLENDER message as bytes: per report, the query and the URL as a 4-byte big-endian
    length and UTF-8 (a URL of null as length 0xFFFFFFFF)."""
    out = bytearray(struct.pack(">I", len(reports)))
    for rep in reports:
        for text in (rep["query"], rep["url"]):
            if text is None:
                out += struct.pack(">I", _NULL_URL)
            else:
                raw = text.encode("utf-8")
                out += struct.pack(">I", len(raw)) + raw
    return bytes(out)


def mean_payload(value: float) -> bytes:
    """A mean message's value as its IEEE-754 double, big-endian."""
    return b"v" + struct.pack(">d", float(value))


def nonce(message_id: str, payload: bytes) -> bytes:
    """The token nonce of a message: SHA-256 of the domain, the message id and the payload."""
    return hashlib.sha256(NONCE_DOMAIN + message_id.encode("ascii") + b"\x00" + payload).digest()


def token_input(round_id: str, key_id: bytes, message_id: str, payload: bytes) -> bytes:
    """``0x0002 || nonce || SHA-256(challenge) || token_key_id`` (RFC 9578 §6.1), what the authenticator signs."""
    return (struct.pack(">H", TOKEN_TYPE) + nonce(message_id, payload) + hashlib.sha256(challenge(round_id)).digest()
            + key_id)


# ----- keys -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundKey:
    """A round's token public key: what devices fetch (``GET /api/v1/rounds/{id}/token-key``) and the
    verifier uses. ``spki`` is the DER SubjectPublicKeyInfo with the RSASSA-PSS OID (RFC 9578 §6.5)."""

    round_id: str
    spki: bytes

    @property
    def public_key(self) -> rsa.RSAPublicKey:
        key = serialization.load_der_public_key(self.spki)
        assert isinstance(key, rsa.RSAPublicKey)
        return key

    @property
    def key_id(self) -> bytes:
        return hashlib.sha256(self.spki).digest()

    def to_dict(self) -> dict[str, Any]:
        return {"token_type": TOKEN_TYPE, "variant": VARIANT.rfc_name, "round": self.round_id,
                "public_key": b64(self.spki), "key_id": b64(self.key_id), "challenge": b64(challenge(self.round_id))}

    @classmethod
    def from_dict(cls, doc: Any, round_id: str) -> RoundKey:
        """The key a device fetched, checked: its round, token type, and that ``key_id`` is SHA-256 of the key."""
        if not isinstance(doc, dict):
            raise DataError("token key: expected a JSON object {\"public_key\", \"key_id\", ...}")
        if doc.get("token_type") != TOKEN_TYPE or doc.get("round") != round_id:
            raise DataError(f"token key: made for token type {doc.get('token_type')!r} and round "
                            f"{str(doc.get('round'))[:40]!r}; expected {TOKEN_TYPE} and {round_id}")
        key = cls(round_id, unb64(doc.get("public_key"), "public_key"))
        try:
            pub = key.public_key
        except (ValueError, AssertionError):
            raise DataError("token key: field 'public_key' is not an RSA SubjectPublicKeyInfo") from None
        if pub.key_size != KEY_BITS or unb64(doc.get("key_id"), "key_id", 32) != key.key_id:
            raise DataError("token key: not a 2048-bit key, or 'key_id' is not SHA-256 of 'public_key'")
        return key


def new_private_key() -> rsa.RSAPrivateKey:
    """A fresh round key (RSA-2048, e = 65537, from the OS's randomness through OpenSSL)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)


def private_der(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@functools.lru_cache(maxsize=64)
def load_private(der: bytes) -> rsa.RSAPrivateKey:
    """The private key of PKCS#8 ``der``, cached: OpenSSL checks an RSA key as it loads it (about 0.1 s)."""
    key = serialization.load_der_private_key(der, password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    return key


def round_key(round_id: str, key: rsa.RSAPrivateKey | rsa.RSAPublicKey) -> RoundKey:
    pub = key.public_key() if isinstance(key, rsa.RSAPrivateKey) else key
    return RoundKey(round_id, blindrsa.public_key_spki(pub))


def blinded_input(key: rsa.RSAPrivateKey, blinded_msg: Any, field: str = "blinded_msg") -> bytes:
    """The bytes of one base64 blinded message, checked: 256 bytes and below the key's modulus (a
    :class:`DataError` naming ``field`` otherwise). The issuer checks every message of a request before it counts
    any (:func:`sign_blinded` then signs them)."""
    raw = unb64(blinded_msg, field, AUTHENTICATOR_BYTES)
    pub = key.public_key()
    if int.from_bytes(raw, "big") >= pub.public_numbers().n:
        raise DataError(f"field {field!r} is not below the round's modulus: blind it under key "
                        f"{b64(blindrsa.token_key_id(pub))[:12]}… (the round's token-key document)")
    return raw


def sign_blinded(key: rsa.RSAPrivateKey, raw: bytes, field: str = "blinded_msg") -> str:
    """The issuer's step (RFC 9474 §4.3): the base64 blind signature of a blinded message :func:`blinded_input`
    read."""
    try:
        return b64(blindrsa.blind_sign(key, raw))
    except blindrsa.BlindRSAError as exc:
        raise DataError(f"field {field!r}: {exc}") from None


def issue(key: rsa.RSAPrivateKey, blinded_msg: Any, field: str = "blinded_msg") -> str:
    """The blind signature of one base64 blinded message (a :class:`DataError` if malformed)."""
    return sign_blinded(key, blinded_input(key, blinded_msg, field), field)


# ----- the device's side ------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenRequest:
    """A device's pending token for one message: ``blinded`` goes to the issuer; ``finalize`` the answer."""

    key: RoundKey
    token_input: bytes
    blinded: str
    inv: int

    @classmethod
    def make(cls, key: RoundKey, message_id: str, payload: bytes) -> TokenRequest:
        msg = token_input(key.round_id, key.key_id, message_id, payload)
        blinded, inv = blindrsa.blind(key.public_key, msg, variant=VARIANT)
        return cls(key, msg, b64(blinded), inv)

    def finalize(self, blind_sig: Any) -> str:
        """The token (base64 authenticator) from the issuer's answer; a :class:`DataError` if it does not verify."""
        raw = unb64(blind_sig, "blind_sig", AUTHENTICATOR_BYTES)
        try:
            return b64(blindrsa.finalize(self.key.public_key, self.token_input, raw, self.inv, variant=VARIANT))
        except blindrsa.BlindRSAError as exc:
            raise DataError(f"the issuer's answer is not a valid blind signature under key "
                            f"{b64(self.key.key_id)[:12]}…: {exc}") from None


def message_payload(msg: dict[str, Any]) -> bytes:
    """The payload a message's token is bound to: its reports, or its mean value."""
    return mean_payload(msg["value"]) if "value" in msg else blender_payload(msg["reports"])


# ----- the server's side ------------------------------------------------------------------------
class TokenVerifier:
    """Checks the tokens of one round's messages (about 35 µs each: one RSA-2048 PSS verification)."""

    def __init__(self, key: RoundKey) -> None:
        self.key = key
        self._pub = key.public_key
        self._prefix_tail = hashlib.sha256(challenge(key.round_id)).digest() + key.key_id

    def check(self, msg: dict[str, Any], message_id: str, payload: bytes, source: str) -> None:
        """Raise :class:`DataError` unless ``msg["token"]`` is a valid token of this round for this message."""
        tok = msg.get("token")
        if tok is None:
            raise TokenError(f"{source}: field 'token' is missing; this server admits only reports that carry a "
                            "report token (docs/TOKENS.md: a device gets one with POST "
                            "/api/v1/rounds/{id}/tokens and its device credential)", "token_required")
        try:
            sig = unb64(tok, f"{source}: token", AUTHENTICATOR_BYTES)
        except DataError as exc:
            raise TokenError(str(exc)) from None
        msg_input = struct.pack(">H", TOKEN_TYPE) + nonce(message_id, payload) + self._prefix_tail
        if not blindrsa.verify(self._pub, msg_input, sig, variant=VARIANT):
            raise TokenError(f"{source}: the token does not verify for message {message_id}: it was issued for "
                            "another message or round (a token is spent by exactly one message), or not by "
                            "this server")
