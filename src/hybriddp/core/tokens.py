"""Anonymous one-message report tokens: Privacy Pass publicly verifiable tokens (RFC 9578 §6, type 2).

A device admitted to a round (docs/TOKENS.md) obtains one token per message it will send, *before* the message
exists, and spends it later:

1. The round's key is committed: the head list the device randomizes over names its key id, modulus size and
   exponent (``token_key``, inside the document's content hash); :func:`check_committed_key` refuses any other
   key, an exponent other than 65537 and a modulus of other than 2048 bits. A server that hands devices
   different keys must hand them different head lists, which a consistency check (a mirror) exposes.
2. The device draws a random 32-byte ``nonce`` (:func:`new_nonce`) and blinds ``token_input = 0x0002 || nonce ||
   SHA-256(TokenChallenge) || token_key_id`` (RFC 9578 §6.1, the challenge naming the round: :func:`challenge`)
   under the round's key; the issuer signs it blind (:func:`issue`, RFC 9474 §4.3) for an admitted credential.
3. The device finalizes the token (:class:`TokenRequest`), the RFC 9578 §2.2 ``Token`` structure (354 bytes), and
   keeps it. Its message, made later, takes the id derived from the nonce (:func:`message_id_for`) and the token
   in ``"token"``.
4. The reports endpoint checks the token and that the id is the derived one (:class:`TokenVerifier`).

Guarantees. The issuer sees only a blinded message, uniformly distributed whatever the nonce, so no record of
the issuance can be matched to the token it later finalizes into (RFC 9474 §7.3). Because the id is a function
of the nonce, the service's deduplication by message id is the round's table of spent nonces: a retry of a
message with its token counts once, and any other message carrying the same token has the same id and is not
counted again. The token is not bound to the message's content: a device chooses its reports anyway.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
import hashlib
import secrets
import struct
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
NONCE_BYTES = 32
MESSAGE_ID_DOMAIN = b"hybriddp message id v2\x00"
PUBLIC_EXPONENT = 65537
"""The only RSA public exponent a device accepts (a server choosing its own could tag devices by it)."""
VARIANT = blindrsa.TOKEN_TYPE_2_VARIANT
AUTHENTICATOR_BYTES = KEY_BITS // 8
TOKEN_INPUT_BYTES = 2 + NONCE_BYTES + 32 + 32
"""``token_type || nonce || challenge_digest || token_key_id`` (RFC 9578 §2.2 without the authenticator)."""
TOKEN_BYTES = TOKEN_INPUT_BYTES + AUTHENTICATOR_BYTES
"""A whole ``Token`` structure (RFC 9578 §2.2): 354 bytes."""
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


def new_nonce() -> bytes:
    """A token's nonce: 32 bytes from the OS (RFC 9578 §2.2), drawn before the message exists."""
    return secrets.token_bytes(NONCE_BYTES)


def message_id_for(nonce: bytes) -> str:
    """The id of the message that spends the token with this nonce: the first 16 bytes of SHA-256("hybriddp message
    id v2" 0x00 || nonce) in URL-safe base64 without padding (22 characters, like every message id)."""
    return base64.urlsafe_b64encode(hashlib.sha256(MESSAGE_ID_DOMAIN + nonce).digest()[:16])[:22].decode("ascii")


def token_input(round_id: str, key_id: bytes, nonce: bytes) -> bytes:
    """``0x0002 || nonce || SHA-256(challenge) || token_key_id`` (RFC 9578 §6.1), what the authenticator signs."""
    if len(nonce) != NONCE_BYTES or len(key_id) != 32:
        raise DataError(f"token input: the nonce must hold {NONCE_BYTES} bytes and the key id 32, found "
                        f"{len(nonce)} and {len(key_id)}")
    return struct.pack(">H", TOKEN_TYPE) + nonce + hashlib.sha256(challenge(round_id)).digest() + key_id


@dataclass(frozen=True)
class Token:
    """A parsed ``Token`` (RFC 9578 §2.2): the signed input's fields and the authenticator."""

    nonce: bytes
    challenge_digest: bytes
    key_id: bytes
    authenticator: bytes

    @property
    def signed_input(self) -> bytes:
        return struct.pack(">H", TOKEN_TYPE) + self.nonce + self.challenge_digest + self.key_id

    @property
    def message_id(self) -> str:
        return message_id_for(self.nonce)

    def encode(self) -> str:
        """The token as it travels in a message's ``"token"`` field: URL-safe base64 of the 354 bytes."""
        return b64(self.signed_input + self.authenticator)

    @classmethod
    def parse(cls, text: Any, field: str = "token") -> Token:
        """The token of a message's field (a :class:`TokenError` naming the field if it is not a type-2 token)."""
        try:
            raw = unb64(text, field, TOKEN_BYTES)
        except DataError as exc:
            raise TokenError(f"{exc} (a Privacy Pass type-2 Token, RFC 9578 §2.2: docs/TOKENS.md)") from None
        if struct.unpack(">H", raw[:2])[0] != TOKEN_TYPE:
            raise TokenError(f"{field}: token type {raw[:2].hex()} is not 0002 (publicly verifiable, RFC 9578 §6)")
        n = 2 + NONCE_BYTES
        return cls(raw[2:n], raw[n:n + 32], raw[n + 32:n + 64], raw[TOKEN_INPUT_BYTES:])


# ----- the schedule ---------------------------------------------------------------------------
def parse_time(text: Any, field: str) -> float:
    """Seconds since the epoch of an ISO-8601 UTC time ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z`` (DataError otherwise)."""
    if not isinstance(text, str) or not text.endswith("Z") or len(text) > 40:
        raise DataError(f"field {field!r} = {str(text)[:40]!r} must be a UTC time like '2026-11-28T19:00:00Z'")
    try:
        stamp = datetime.datetime.fromisoformat(text[:-1]).replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        raise DataError(f"field {field!r} = {text!r} is not an ISO-8601 UTC time like '2026-11-28T19:00:00Z'") from None
    return stamp.timestamp()


def format_time(seconds: float) -> str:
    """``YYYY-MM-DDTHH:MM:SSZ`` (whole seconds, UTC), as :func:`parse_time` reads it."""
    return datetime.datetime.fromtimestamp(int(seconds), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_window(doc: dict[str, Any]) -> tuple[float, float] | None:
    """A head list's ``report_window`` as (opens, closes) in epoch seconds; None when it has none."""
    win = doc.get("report_window")
    if win is None:
        return None
    if not isinstance(win, dict):
        raise DataError("field 'report_window' must be an object {\"opens\": time, \"closes\": time}")
    opens = parse_time(win.get("opens"), "report_window.opens")
    closes = parse_time(win.get("closes"), "report_window.closes")
    if closes < opens:
        raise DataError(f"field 'report_window': closes ({win.get('closes')}) is before opens ({win.get('opens')})")
    return opens, closes


def report_time(window: tuple[float, float] | None, now: float, uniform: Any = None) -> float:
    """When a device sends its message (docs/TOKENS.md "When a device reports"): uniformly at random in the round's
    report window, independent of when it got its token. Before the window opens: uniform over the whole window;
    inside it: uniform over what is left; after it (or with no window): now. ``uniform(a, b)`` draws the time
    (default: the OS's randomness)."""
    if window is None:
        return now
    opens, closes = window
    start = max(now, opens)
    if now >= closes:
        return now
    if start >= closes:  # a window of no length not yet reached: its one instant, not now
        return start
    draw = uniform or secrets.SystemRandom().uniform
    return float(draw(start, closes))


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

    def committed(self) -> dict[str, Any]:
        """What a head list commits to about this key (its ``token_key`` field): key id, modulus size, exponent."""
        nums = self.public_key.public_numbers()
        return {"key_id": b64(self.key_id), "modulus_bits": nums.n.bit_length(), "e": nums.e}

    @classmethod
    def from_dict(cls, doc: Any, round_id: str, committed: Any = None) -> RoundKey:
        """The key a device fetched, checked: its round, token type, that ``key_id`` is SHA-256 of the key, a
        2048-bit modulus and e = 65537; with ``committed`` (the head list's ``token_key``), that it is exactly the
        key the head list commits to (:func:`check_committed_key`)."""
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
        if pub.public_numbers().e != PUBLIC_EXPONENT:
            raise DataError(f"token key: public exponent {pub.public_numbers().e} is not {PUBLIC_EXPONENT}; a device "
                            "accepts no other (a server could tell devices apart by their keys' exponents)")
        if committed is not None:
            check_committed_key(key, committed)
        return key


def check_committed_key(key: RoundKey, committed: Any, source: str = "token key") -> None:
    """Refuse (:class:`DataError`) a token key that is not the one a head list commits to in ``token_key``.

    This is what makes a round's key the same for every device: a server that handed each device its own key
    (to tell later which device a token came from) would have to hand each its own head list, whose content hash
    differs, which a consistency check against a mirror exposes (docs/TOKENS.md)."""
    if not isinstance(committed, dict):
        raise DataError(f"{source}: the head list commits to no token key (field 'token_key'); it was published "
                        "before round keys were committed, or by a server that does not commit them. Nothing was "
                        "sent; ask the operator to publish the round again")
    want = unb64(committed.get("key_id"), "token_key.key_id", 32)
    nums = key.public_key.public_numbers()
    if want != key.key_id:
        raise DataError(f"{source}: key {b64(key.key_id)[:12]}… is not the key the head list commits to "
                        f"({b64(want)[:12]}…): the server may be telling devices apart by their keys. Nothing was "
                        "sent")
    bits = committed.get("modulus_bits")
    if committed.get("e") != PUBLIC_EXPONENT or nums.e != PUBLIC_EXPONENT:
        raise DataError(f"{source}: exponent {committed.get('e')!r} (key: {nums.e}); only {PUBLIC_EXPONENT} is "
                        "accepted. Nothing was sent")
    if isinstance(bits, bool) or not isinstance(bits, int) or bits < KEY_BITS or bits != nums.n.bit_length():
        raise DataError(f"{source}: modulus of {nums.n.bit_length()} bits, the head list says {bits!r}; at least "
                        f"{KEY_BITS} bits and the two equal are needed. Nothing was sent")


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
    """A device's pending token: ``blinded`` goes to the issuer; :meth:`finalize` turns the answer into the token.

    The nonce is drawn here, before any message exists, so a device can get its token when it downloads the
    head list and spend it at a random later time (docs/TOKENS.md)."""

    key: RoundKey
    nonce: bytes
    token_input: bytes
    blinded: str
    inv: int

    @classmethod
    def make(cls, key: RoundKey, nonce: bytes | None = None) -> TokenRequest:
        nonce = new_nonce() if nonce is None else nonce
        msg = token_input(key.round_id, key.key_id, nonce)
        blinded, inv = blindrsa.blind(key.public_key, msg, variant=VARIANT)
        return cls(key, nonce, msg, b64(blinded), inv)

    @property
    def message_id(self) -> str:
        """The id of the message that will spend this token."""
        return message_id_for(self.nonce)

    def finalize(self, blind_sig: Any) -> str:
        """The token (URL-safe base64 of the 354-byte ``Token``) from the issuer's answer; a :class:`DataError` if
        it does not verify."""
        raw = unb64(blind_sig, "blind_sig", AUTHENTICATOR_BYTES)
        try:
            auth = blindrsa.finalize(self.key.public_key, self.token_input, raw, self.inv, variant=VARIANT)
        except blindrsa.BlindRSAError as exc:
            raise DataError(f"the issuer's answer is not a valid blind signature under key "
                            f"{b64(self.key.key_id)[:12]}…: {exc}") from None
        return b64(self.token_input + auth)


def spend(message: dict[str, Any], token: str) -> dict[str, Any]:
    """``message`` with ``token`` and the id derived from the token's nonce (the message that spends it)."""
    return {**message, "id": Token.parse(token).message_id, "token": token}


# ----- the server's side ------------------------------------------------------------------------
class TokenVerifier:
    """Checks the tokens of one round's messages (about 35 µs each: one RSA-2048 PSS verification)."""

    def __init__(self, key: RoundKey) -> None:
        self.key = key
        self._pub = key.public_key
        self._challenge_digest = hashlib.sha256(challenge(key.round_id)).digest()

    def check(self, msg: dict[str, Any], message_id: str, source: str) -> None:
        """Raise :class:`TokenError` unless ``msg["token"]`` is a valid token of this round whose nonce gives
        ``message_id``."""
        tok = msg.get("token")
        if tok is None:
            raise TokenError(f"{source}: field 'token' is missing; this server admits only reports that carry a "
                            "report token (docs/TOKENS.md: a device gets one with POST "
                            "/api/v1/rounds/{id}/tokens and its device credential)", "token_required")
        token = Token.parse(tok, f"{source}: token")
        if token.challenge_digest != self._challenge_digest or token.key_id != self.key.key_id:
            raise TokenError(f"{source}: the token was issued for another round or under another key than this "
                            f"round's ({b64(self.key.key_id)[:12]}…)")
        if not blindrsa.verify(self._pub, token.signed_input, token.authenticator, variant=VARIANT):
            raise TokenError(f"{source}: the token's authenticator does not verify: it was not issued by this "
                            "server for this round")
        if token.message_id != message_id:
            raise TokenError(f"{source}: message id {message_id} is not the one derived from its token's nonce "
                            f"({token.message_id}); a token is spent by the message whose id it gives "
                            "(docs/TOKENS.md)")
