"""HPKE (RFC 9180), base mode, for the one suite of protocol v2 (spec-v2.md §4).

Suite: KEM DHKEM(P-256, HKDF-SHA256) ``0x0010``, KDF HKDF-SHA256 ``0x0001``, AEAD AES-128-GCM ``0x0001``
(all in WebCrypto, so browsers can speak it too). The flow (RFC 9180 §5.1.1, §5.2, §5.3)::

    enc, ctx = setup_base_s(pk_r_bytes, info)        # sender: one ephemeral key, one ECDH
    ct = ctx.seal(aad, pt)                            # sequence number 0, 1, ...
    ctx_r = setup_base_r(enc, sk_r, info)             # recipient: one ECDH
    pt = ctx_r.open(aad, ct)                          # raises OpenError unless authentic
    secret = ctx.export(exporter_context, length)     # the same on both sides

Elliptic-curve arithmetic, AES-GCM and HMAC are OpenSSL's (through ``cryptography`` and :mod:`hmac`): per
context, one key generation (sender), one ECDH, a few HMAC-SHA256 calls. Public keys are the 65-byte
uncompressed SEC1 point (RFC 9180 §7.1.1); private keys serialize as the 32-byte big-endian scalar (§7.1.2).
Every public key read is checked to be a point on P-256 (partial validation, §7.1.4). Randomness is the OS's.
"""

from __future__ import annotations

import functools
import hmac
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hybriddp.core.errors import DataError

KEM_ID = 0x0010  # DHKEM(P-256, HKDF-SHA256), RFC 9180 §7.1
KDF_ID = 0x0001  # HKDF-SHA256, §7.2
AEAD_ID = 0x0001  # AES-128-GCM, §7.3
MODE_BASE = 0x00  # §5

N_SECRET = 32  # KEM shared secret, bytes (§7.1 table)
N_ENC = 65  # encapsulated key = serialized ephemeral public key
N_PK = 65  # serialized public key
N_SK = 32  # serialized private key
N_H = 32  # KDF output (SHA-256)
N_K = 16  # AEAD key
N_N = 12  # AEAD nonce
N_T = 16  # AEAD tag

P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # §7.1.3

_VERSION = b"HPKE-v1"
KEM_SUITE_ID = b"KEM" + KEM_ID.to_bytes(2, "big")  # §4.1
SUITE_ID = b"HPKE" + KEM_ID.to_bytes(2, "big") + KDF_ID.to_bytes(2, "big") + AEAD_ID.to_bytes(2, "big")  # §5.1


class HPKEError(DataError):
    """An HPKE input is malformed (a key that is not a P-256 point, a bad length, ...)."""


class OpenError(HPKEError):
    """A ciphertext does not decrypt: wrong key, wrong context, wrong AAD or tampered (RFC 9180 §5.2 OpenError)."""


class MessageLimitReachedError(HPKEError):
    """A context's sequence number would overflow its nonce (RFC 9180 §5.2)."""


# ----- KDF: HKDF-SHA256 (RFC 5869) and its labeled forms (RFC 9180 §4) ------------------------------------


def extract(salt: bytes, ikm: bytes) -> bytes:
    """HKDF-Extract (RFC 5869 §2.2): HMAC-SHA256 keyed with ``salt`` (an empty salt means Nh zero bytes)."""
    return hmac.digest(salt or bytes(N_H), ikm, "sha256")


def expand(prk: bytes, info: bytes, length: int) -> bytes:
    """HKDF-Expand (RFC 5869 §2.3): ``length`` ≤ 255·Nh bytes."""
    if not 0 <= length <= 255 * N_H:
        raise HPKEError(f"HKDF-Expand length {length} is out of range: it must be 0..{255 * N_H}")
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.digest(prk, block + info + bytes([counter]), "sha256")
        out += block
        counter += 1
    return out[:length]


def labeled_extract(salt: bytes, label: bytes, ikm: bytes, suite_id: bytes = SUITE_ID) -> bytes:
    """``LabeledExtract`` (RFC 9180 §4): Extract(salt, "HPKE-v1" || suite_id || label || ikm)."""
    return extract(salt, _VERSION + suite_id + label + ikm)


def labeled_expand(prk: bytes, label: bytes, info: bytes, length: int, suite_id: bytes = SUITE_ID) -> bytes:
    """``LabeledExpand`` (RFC 9180 §4): Expand(prk, I2OSP(L, 2) || "HPKE-v1" || suite_id || label || info, L)."""
    if not 0 <= length < 1 << 16:
        raise HPKEError(f"LabeledExpand length {length} does not fit in two bytes")
    return expand(prk, length.to_bytes(2, "big") + _VERSION + suite_id + label + info, length)


# ----- keys (RFC 9180 §7.1.1–§7.1.4) --------------------------------------------------------------------


def generate_key_pair() -> ec.EllipticCurvePrivateKey:
    """A fresh P-256 key pair from the OS's randomness (RFC 9180 §4 ``GenerateKeyPair``)."""
    return ec.generate_private_key(ec.SECP256R1())


def derive_key_pair(ikm: bytes) -> ec.EllipticCurvePrivateKey:
    """``DeriveKeyPair`` for P-256 (RFC 9180 §7.1.3): rejection sampling of a scalar from ``ikm``.

    Deterministic: the same ``ikm`` gives the same key (used to replay the RFC 9180 Appendix A vectors).
    ``ikm`` should have at least Nsk = 32 bytes of entropy.
    """
    dkp_prk = labeled_extract(b"", b"dkp_prk", ikm, KEM_SUITE_ID)
    for counter in range(256):
        candidate = labeled_expand(dkp_prk, b"candidate", bytes([counter]), N_SK, KEM_SUITE_ID)
        sk = int.from_bytes(candidate, "big")  # bitmask 0xFF for P-256: nothing to clear
        if 0 < sk < P256_ORDER:
            return ec.derive_private_key(sk, ec.SECP256R1())
    raise HPKEError("DeriveKeyPair found no scalar in 256 candidates (RFC 9180 §7.1.3 DeriveKeyPairError)")


def serialize_public_key(pk: ec.EllipticCurvePublicKey) -> bytes:
    """``SerializePublicKey`` (RFC 9180 §7.1.1): the 65-byte uncompressed point 0x04 || x || y."""
    return pk.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


def deserialize_public_key(data: bytes) -> ec.EllipticCurvePublicKey:
    """``DeserializePublicKey`` (RFC 9180 §7.1.1) with partial public-key validation (§7.1.4).

    Guarantee: the result is a point on P-256 other than the identity; anything else raises :class:`HPKEError`.
    """
    data = bytes(data)
    if len(data) != N_PK or data[0] != 0x04:
        raise HPKEError(f"a P-256 public key must be the 65-byte uncompressed point 0x04 || x || y; "
                        f"got {len(data)} bytes starting {data[:1].hex() or 'with nothing'}")
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), data)
    except ValueError as e:
        raise HPKEError(f"the public key is not a point on P-256: {e}") from None


def serialize_private_key(sk: ec.EllipticCurvePrivateKey) -> bytes:
    """``SerializePrivateKey`` (RFC 9180 §7.1.2): the scalar as 32 big-endian bytes."""
    return sk.private_numbers().private_value.to_bytes(N_SK, "big")


def deserialize_private_key(data: bytes) -> ec.EllipticCurvePrivateKey:
    """``DeserializePrivateKey`` (RFC 9180 §7.1.2): a 32-byte big-endian scalar in [1, order)."""
    if len(data) != N_SK:
        raise HPKEError(f"a P-256 private key must be {N_SK} bytes, got {len(data)}")
    sk = int.from_bytes(data, "big")
    if not 0 < sk < P256_ORDER:
        raise HPKEError("the private key scalar is 0 or not below the P-256 group order")
    return ec.derive_private_key(sk, ec.SECP256R1())


def _private_key(sk: ec.EllipticCurvePrivateKey | bytes) -> ec.EllipticCurvePrivateKey:
    if isinstance(sk, ec.EllipticCurvePrivateKey):
        if not isinstance(sk.curve, ec.SECP256R1):
            raise HPKEError(f"the private key is on {sk.curve.name}, not P-256")
        return sk
    return deserialize_private_key(bytes(sk))


# ----- DHKEM(P-256, HKDF-SHA256) (RFC 9180 §4.1) ---------------------------------------------------------


def _extract_and_expand(dh: bytes, kem_context: bytes) -> bytes:
    eae_prk = labeled_extract(b"", b"eae_prk", dh, KEM_SUITE_ID)
    return labeled_expand(eae_prk, b"shared_secret", kem_context, N_SECRET, KEM_SUITE_ID)


def encap(pk_r_bytes: bytes, *, sk_e: ec.EllipticCurvePrivateKey | None = None) -> tuple[bytes, bytes]:
    """``Encap(pkR)`` (RFC 9180 §4.1) → ``(shared_secret, enc)``.

    ``sk_e`` fixes the ephemeral key: only to replay test vectors (a reused one breaks confidentiality).
    """
    pk_r = deserialize_public_key(pk_r_bytes)
    sk_e = sk_e if sk_e is not None else generate_key_pair()
    dh = sk_e.exchange(ec.ECDH(), pk_r)
    enc = serialize_public_key(sk_e.public_key())
    return _extract_and_expand(dh, enc + bytes(pk_r_bytes)), enc


def decap(enc: bytes, sk_r: ec.EllipticCurvePrivateKey | bytes, *, pk_r_bytes: bytes | None = None) -> bytes:
    """``Decap(enc, skR)`` (RFC 9180 §4.1) → ``shared_secret``; ``enc`` is validated as a P-256 point.

    ``pk_r_bytes`` (the serialized public key of ``sk_r``) may be passed to save recomputing it.
    """
    key = _private_key(sk_r)
    pk_e = deserialize_public_key(enc)
    dh = key.exchange(ec.ECDH(), pk_e)
    pk_rm = pk_r_bytes if pk_r_bytes is not None else serialize_public_key(key.public_key())
    return _extract_and_expand(dh, bytes(enc) + pk_rm)


# ----- key schedule and contexts (RFC 9180 §5.1, §5.2, §5.3) ----------------------------------------------


@dataclass
class Context:
    """An HPKE encryption context (RFC 9180 §5.1): AEAD key, base nonce, exporter secret, sequence number.

    The nonce of message ``seq`` is ``base_nonce XOR I2OSP(seq, Nn)`` (§5.2); the sequence number advances
    after each successful seal/open, so each side must process messages in the same order.
    """

    key: bytes
    base_nonce: bytes
    exporter_secret: bytes
    seq: int = 0
    _aead: AESGCM = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._aead = AESGCM(self.key)

    def compute_nonce(self, seq: int) -> bytes:
        """``ComputeNonce`` (RFC 9180 §5.2)."""
        return bytes(a ^ b for a, b in zip(self.base_nonce, seq.to_bytes(N_N, "big"), strict=True))

    def _check_seq(self) -> None:
        if self.seq >= (1 << (8 * N_N)) - 1:  # IncrementSeq (§5.2) would overflow
            raise MessageLimitReachedError("the HPKE context has used every nonce of its sequence (RFC 9180 §5.2)")

    def export(self, exporter_context: bytes, length: int) -> bytes:
        """Secret export (RFC 9180 §5.3): LabeledExpand(exporter_secret, "sec", exporter_context, L), L ≤ 255·Nh."""
        if not 0 <= length <= 255 * N_H:
            raise HPKEError(f"an HPKE export length must be 0..{255 * N_H}, got {length}")
        return labeled_expand(self.exporter_secret, b"sec", bytes(exporter_context), length)


class SenderContext(Context):
    """The sender's context: :meth:`seal` encrypts (RFC 9180 §5.2 ``ContextS.Seal``)."""

    def seal(self, aad: bytes, pt: bytes) -> bytes:
        """AES-128-GCM encryption of ``pt`` with ``aad`` under the next nonce; returns ciphertext || tag."""
        self._check_seq()
        ct = self._aead.encrypt(self.compute_nonce(self.seq), bytes(pt), bytes(aad))
        self.seq += 1
        return ct


class RecipientContext(Context):
    """The recipient's context: :meth:`open` decrypts (RFC 9180 §5.2 ``ContextR.Open``)."""

    def open(self, aad: bytes, ct: bytes) -> bytes:
        """Decrypt ``ct`` (ciphertext || 16-byte tag) with ``aad`` under the next nonce.

        Guarantee: returns the plaintext only if it was sealed by the matching sender context with this
        ``aad`` at this sequence number; otherwise raises :class:`OpenError` and the sequence number stays.
        """
        self._check_seq()
        try:
            pt = self._aead.decrypt(self.compute_nonce(self.seq), bytes(ct), bytes(aad))
        except InvalidTag:
            raise OpenError("HPKE decryption failed: the ciphertext is not authentic under this context "
                            "(wrong key, wrong associated data, or tampered)") from None
        self.seq += 1
        return pt


def key_schedule(shared_secret: bytes, info: bytes) -> tuple[bytes, bytes, bytes]:
    """``KeySchedule`` for mode_base (RFC 9180 §5.1) with empty psk/psk_id → ``(key, base_nonce, exporter_secret)``."""
    ks_context = _ks_context(bytes(info))
    secret = labeled_extract(shared_secret, b"secret", b"")
    return (labeled_expand(secret, b"key", ks_context, N_K),
            labeled_expand(secret, b"base_nonce", ks_context, N_N),
            labeled_expand(secret, b"exp", ks_context, N_H))


@functools.lru_cache(maxsize=64)
def _ks_context(info: bytes) -> bytes:
    """``key_schedule_context`` of mode_base (RFC 9180 §5.1): it depends on ``info`` alone (the psk is empty), and a
    gateway's is the same for every request, so it is memoized."""
    psk_id_hash = labeled_extract(b"", b"psk_id_hash", b"")
    info_hash = labeled_extract(b"", b"info_hash", info)
    return bytes([MODE_BASE]) + psk_id_hash + info_hash


def setup_base_s(pk_r_bytes: bytes, info: bytes, *,
                 sk_e: ec.EllipticCurvePrivateKey | None = None) -> tuple[bytes, SenderContext]:
    """``SetupBaseS(pkR, info)`` (RFC 9180 §5.1.1) → ``(enc, context)``; ``enc`` is 65 bytes.

    ``sk_e`` fixes the ephemeral key, for test vectors only (RFC 9180 §9.7.1: never reuse one).
    """
    shared_secret, enc = encap(pk_r_bytes, sk_e=sk_e)
    return enc, SenderContext(*key_schedule(shared_secret, info))


def setup_base_r(enc: bytes, sk_r: ec.EllipticCurvePrivateKey | bytes, info: bytes, *,
                 pk_r_bytes: bytes | None = None) -> RecipientContext:
    """``SetupBaseR(enc, skR, info)`` (RFC 9180 §5.1.1): ``sk_r`` is a P-256 key or its 32-byte scalar.

    Raises :class:`HPKEError` when ``enc`` is not a valid P-256 point.
    """
    return RecipientContext(*key_schedule(decap(enc, sk_r, pk_r_bytes=pk_r_bytes), info))
