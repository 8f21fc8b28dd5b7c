"""RSA blind signatures, RSABSSA (RFC 9474): the core of anonymous one-per-round report tokens.

The protocol (RFC 9474 §4) runs between a client and a signer holding an RSA key::

    input_msg = prepare(msg, randomized, rng)                        # client, §4.1
    blinded_msg, inv = blind(pk, input_msg, variant=v)               # client, §4.2
    blind_sig = blind_sign(sk, blinded_msg)                          # signer, §4.3
    sig = finalize(pk, input_msg, blind_sig, inv, variant=v)         # client, §4.4
    verify(pk, input_msg, sig, variant=v)                            # anyone, §4.5

The signer sees only ``blinded_msg``, uniformly distributed whatever the message, so it cannot link
a signature to the session that produced it. ``sig`` is a standard RSASSA-PSS signature (SHA-384,
MGF1-SHA-384) over ``input_msg``.

Privacy Pass publicly verifiable tokens (RFC 9578 §6, token type 0x0002) use
RSABSSA-SHA384-PSS-Deterministic with a 2048-bit key: the client blinds
``token_input = 0x0002 || nonce || SHA256(challenge) || token_key_id``; see :func:`token_key_id`.

Randomness comes from the OS (:func:`secrets.token_bytes`) unless a caller passes ``rng``, a
function ``n -> n random bytes`` (tests use it to reproduce vectors). The keyword-only ``prefix``,
``salt`` and ``r`` arguments exist only to replay the RFC 9474 Appendix A vectors: RFC 9474 §7.4
says production callers should not supply them.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
import secrets
from collections.abc import Callable

import gmpy2
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from hybriddp.core.errors import HybridDPError

Rng = Callable[[int], bytes]
"""A source of random bytes: ``rng(n)`` returns ``n`` bytes."""

PREFIX_LEN = 32  # bytes of the message randomizer, RFC 9474 §4.1
_HASH_LEN = 48  # SHA-384 output, bytes


class BlindRSAError(HybridDPError, ValueError):
    """A blind-signature input is malformed, out of range, or fails verification."""


class Variant(enum.Enum):
    """The four named RSABSSA variants of RFC 9474 §5 (all SHA-384, MGF1 with SHA-384)."""

    SHA384_PSS_RANDOMIZED = ("RSABSSA-SHA384-PSS-Randomized", 48, True)
    SHA384_PSSZERO_RANDOMIZED = ("RSABSSA-SHA384-PSSZERO-Randomized", 0, True)
    SHA384_PSS_DETERMINISTIC = ("RSABSSA-SHA384-PSS-Deterministic", 48, False)
    SHA384_PSSZERO_DETERMINISTIC = ("RSABSSA-SHA384-PSSZERO-Deterministic", 0, False)

    def __init__(self, rfc_name: str, salt_length: int, randomized: bool) -> None:
        self.rfc_name = rfc_name
        self.salt_length = salt_length  # PSS sLen in bytes
        self.randomized = randomized  # PrepareRandomize (True) or PrepareIdentity (False)

    @classmethod
    def from_name(cls, rfc_name: str) -> Variant:
        """The variant named ``rfc_name`` in RFC 9474 §5, e.g. ``"RSABSSA-SHA384-PSS-Deterministic"``."""
        for variant in cls:
            if variant.rfc_name == rfc_name:
                return variant
        raise BlindRSAError(f"unknown RSABSSA variant {rfc_name!r}; known: {', '.join(v.rfc_name for v in cls)}")


TOKEN_TYPE_2_VARIANT = Variant.SHA384_PSS_DETERMINISTIC
"""The variant of Privacy Pass token type 0x0002: RFC 9578 §6.4 verifies with a 48-byte salt."""


# ----- byte and integer helpers (RFC 8017 §4, §B.2.1) ------------------------------------------------


def _modulus_len(public_key: rsa.RSAPublicKey) -> int:
    return (public_key.key_size + 7) // 8


def _int_to_bytes(x: int, length: int) -> bytes:
    return x.to_bytes(length, "big")  # I2OSP


def _bytes_to_int(b: bytes) -> int:
    return int.from_bytes(b, "big")  # OS2IP


def _mgf1_sha384(seed: bytes, length: int) -> bytes:
    """MGF1 with SHA-384 (RFC 8017 §B.2.1)."""
    blocks = (length + _HASH_LEN - 1) // _HASH_LEN
    return b"".join(hashlib.sha384(seed + i.to_bytes(4, "big")).digest() for i in range(blocks))[:length]


def _emsa_pss_encode(msg: bytes, em_bits: int, salt: bytes) -> bytes:
    """EMSA-PSS-ENCODE with SHA-384 and MGF1-SHA-384 (RFC 8017 §9.1.1), salt given."""
    em_len = (em_bits + 7) // 8
    if em_len < _HASH_LEN + len(salt) + 2:
        raise BlindRSAError(f"encoding error: a {em_bits + 1}-bit key is too small for a {len(salt)}-byte salt")
    m_hash = hashlib.sha384(msg).digest()
    h = hashlib.sha384(b"\x00" * 8 + m_hash + salt).digest()
    db = b"\x00" * (em_len - len(salt) - _HASH_LEN - 2) + b"\x01" + salt
    masked = bytearray(a ^ b for a, b in zip(db, _mgf1_sha384(h, len(db)), strict=True))
    masked[0] &= 0xFF >> (8 * em_len - em_bits)  # clear the leftmost 8·emLen − emBits bits
    return bytes(masked) + h + b"\xbc"


def _random_below(n: int, rng: Rng) -> int:
    """Uniform in [1, n) by rejection sampling (RFC 9474 §4.2, random_integer_uniform)."""
    k = (n.bit_length() + 7) // 8
    excess = 8 * k - n.bit_length()
    while True:
        x = _bytes_to_int(rng(k)) >> excess
        if 1 <= x < n:
            return x


def _rsasp1(private_key: rsa.RSAPrivateKey, m: int) -> int:
    """RSASP1 (RFC 8017 §5.2.1) by the CRT, with RSA blinding of the base against timing attacks.

    The two half-size exponentiations use GMP's side-channel-resistant ``powmod_sec`` (about 0.8 ms
    for a 2048-bit key, against 6 ms for Python's ``pow``); the random base blinding (RFC 9474 §7.1)
    also decorrelates the operands from the attacker-chosen ``m``.
    """
    priv = _crt(private_key)
    n, e = priv.public_numbers.n, priv.public_numbers.e
    u = _random_below(n, secrets.token_bytes)
    mb = m * gmpy2.powmod(u, e, n) % n
    sp = gmpy2.powmod_sec(mb % priv.p, priv.dmp1, priv.p)
    sq = gmpy2.powmod_sec(mb % priv.q, priv.dmq1, priv.q)
    sb = sq + priv.q * (priv.iqmp * (sp - sq) % priv.p)
    return int(sb * gmpy2.invert(u, n) % n)


@functools.lru_cache(maxsize=64)
def _crt(private_key: rsa.RSAPrivateKey) -> rsa.RSAPrivateNumbers:
    """The key's numbers (reading them from OpenSSL costs more than a signature's CRT half)."""
    return private_key.private_numbers()


# ----- the protocol (RFC 9474 §4) --------------------------------------------------------------------


def prepare(msg: bytes, randomized: bool, rng: Rng = secrets.token_bytes, *, prefix: bytes | None = None) -> bytes:
    """Prepare ``msg`` for signing (RFC 9474 §4.1).

    PrepareRandomize (``randomized=True``) prepends a fresh 32-byte prefix; PrepareIdentity returns
    ``msg``. The result is what :func:`blind`, :func:`finalize` and :func:`verify` take. ``prefix``
    replays a test vector.
    """
    if not randomized:
        return msg
    prefix = rng(PREFIX_LEN) if prefix is None else prefix
    if len(prefix) != PREFIX_LEN:
        raise BlindRSAError(f"message prefix must be {PREFIX_LEN} bytes, got {len(prefix)}")
    return prefix + msg


def blind(public_key: rsa.RSAPublicKey, msg: bytes, rng: Rng = secrets.token_bytes, *, variant: Variant,
          salt: bytes | None = None, r: int | None = None) -> tuple[bytes, int]:
    """Blind the prepared message ``msg`` for the signer (RFC 9474 §4.2); returns ``(blinded_msg, inv)``.

    ``blinded_msg`` (modulus_len bytes) goes to the signer; ``inv`` = r⁻¹ mod n stays with the client
    for :func:`finalize`. ``salt`` (the PSS salt) and ``r`` (the blinding factor) replay test vectors.
    """
    numbers = public_key.public_numbers()
    n, e = numbers.n, numbers.e
    salt = rng(variant.salt_length) if salt is None else salt
    if len(salt) != variant.salt_length:
        raise BlindRSAError(f"{variant.rfc_name} needs a {variant.salt_length}-byte salt, got {len(salt)}")
    # emBits = bit_len(n) − 1 as in RSASSA-PSS-SIGN (RFC 8017 §8.1.1). RFC 9474 §4.2 step 1 writes
    # bit_len(n), but its Appendix A vectors, and every PSS verifier, use bit_len(n) − 1.
    m = _bytes_to_int(_emsa_pss_encode(msg, n.bit_length() - 1, salt))
    if math.gcd(m, n) != 1:
        raise BlindRSAError("invalid input: the encoded message is not co-prime with n (is the public key valid?)")
    r = _random_below(n, rng) if r is None else r
    if not 1 <= r < n:
        raise BlindRSAError("blinding error: r must be in [1, n)")
    try:
        inv = pow(r, -1, n)
    except ValueError:
        raise BlindRSAError("blinding error: r has no inverse mod n (retry with a fresh r)") from None
    blinded = m * pow(r, e, n) % n  # m · RSAVP1(pk, r)
    return _int_to_bytes(blinded, _modulus_len(public_key)), inv


def blind_sign(private_key: rsa.RSAPrivateKey, blinded_msg: bytes) -> bytes:
    """The signer's RSA private-key operation on a blinded message (RFC 9474 §4.3).

    Refuses inputs of the wrong length or ≥ n, and checks RSAVP1(pk, s) = m before answering: a
    faulty CRT result would otherwise leak a factor of n (RFC 9474 §7.1).
    """
    numbers = private_key.public_key().public_numbers()
    n, e, k = numbers.n, numbers.e, _modulus_len(private_key.public_key())
    if len(blinded_msg) != k:
        raise BlindRSAError(f"unexpected input size: blinded_msg must be {k} bytes, got {len(blinded_msg)}")
    m = _bytes_to_int(blinded_msg)
    if m >= n:
        raise BlindRSAError("message representative out of range: blinded_msg must be < n")
    s = _rsasp1(private_key, m)
    if gmpy2.powmod(s, e, n) != m:
        raise BlindRSAError("signing failure: the signature does not verify (fault in the private-key operation)")
    return _int_to_bytes(s, k)


def finalize(public_key: rsa.RSAPublicKey, msg: bytes, blind_sig: bytes, inv: int, *, variant: Variant) -> bytes:
    """Unblind the signer's answer into a signature over the prepared ``msg`` (RFC 9474 §4.4).

    Raises :class:`BlindRSAError` unless the result is a valid RSASSA-PSS signature of ``msg``.
    """
    k = _modulus_len(public_key)
    n = public_key.public_numbers().n
    if len(blind_sig) != k:
        raise BlindRSAError(f"unexpected input size: blind_sig must be {k} bytes, got {len(blind_sig)}")
    if not 1 <= inv < n:
        raise BlindRSAError("inv must be in [1, n)")
    sig = _int_to_bytes(_bytes_to_int(blind_sig) * inv % n, k)
    if not verify(public_key, msg, sig, variant=variant):
        raise BlindRSAError("invalid signature: the unblinded signature does not verify")
    return sig


def verify(public_key: rsa.RSAPublicKey, msg: bytes, sig: bytes, *, variant: Variant) -> bool:
    """RSASSA-PSS-VERIFY (RFC 8017 §8.1.2) of ``sig`` over the prepared ``msg`` (RFC 9474 §4.5).

    SHA-384, MGF1-SHA-384 and the variant's salt length, checked by ``cryptography`` (OpenSSL).
    For randomized variants the application message is ``msg[32:]``.
    """
    pss = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=variant.salt_length)
    try:
        public_key.verify(sig, msg, pss, hashes.SHA384())
    except InvalidSignature:
        return False
    return True


# ----- key identifiers (RFC 9578 §6.5) ---------------------------------------------------------------


def _der(tag: int, content: bytes) -> bytes:
    """One DER TLV with definite length."""
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


# AlgorithmIdentifier { id-RSASSA-PSS, RSASSA-PSS-params { [0] sha384, [1] mgf1(sha384), [2] saltLength 48 } }
# with the hash parameters omitted, as RFC 9578 §6.5 requires (RFC 4055, RFC 5756).
_SHA384_ALG = _der(0x30, bytes.fromhex("0609608648016503040202"))
_RSASSA_PSS_SHA384_ALG = _der(0x30, bytes.fromhex("06092a864886f70d01010a") + _der(0x30, (
    _der(0xA0, _SHA384_ALG)
    + _der(0xA1, _der(0x30, bytes.fromhex("06092a864886f70d010108") + _SHA384_ALG))
    + _der(0xA2, _der(0x02, bytes([_HASH_LEN]))))))


def public_key_spki(public_key: rsa.RSAPublicKey) -> bytes:
    """The DER SubjectPublicKeyInfo of ``public_key`` with the RSASSA-PSS OID (RFC 9578 §6.5).

    ``cryptography`` writes SPKI only with the rsaEncryption OID, so the AlgorithmIdentifier
    (SHA-384, MGF1-SHA-384, salt length 48) is built here around its PKCS#1 RSAPublicKey.
    ``serialization.load_der_public_key`` reads the result back.
    """
    pkcs1 = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    return _der(0x30, _RSASSA_PSS_SHA384_ALG + _der(0x03, b"\x00" + pkcs1))


def token_key_id(public_key: rsa.RSAPublicKey) -> bytes:
    """``token_key_id`` = SHA-256 of :func:`public_key_spki` (RFC 9578 §6.5), 32 bytes.

    A TokenRequest carries only its last byte, ``truncated_token_key_id`` (RFC 9578 §6.1).
    """
    return hashlib.sha256(public_key_spki(public_key)).digest()
