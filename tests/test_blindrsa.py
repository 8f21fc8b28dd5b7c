"""RSA blind signatures (hybriddp.core.blindrsa).

* RFC 9474 Appendix A: every given value of the four variants' vectors, byte for byte.
* RFC 9578 Appendix A.2 (Privacy Pass token type 0x0002): SPKI with the RSASSA-PSS OID, token_key_id,
  TokenRequest, TokenResponse and Token, byte for byte.
* Round trips with a fresh 2048-bit key, refusals of tampered or malformed inputs, and the blindness
  the signer relies on: its view is freshly randomized and uniform whatever the message.

The vectors live in tests/blindrsa_vectors.json; its "_source" entry says where each set comes from
(RFC 9474 Appendix A, RFC 9578 Appendix A.2).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from hybriddp.core import blindrsa as B
from hybriddp.core.blindrsa import (
    TOKEN_TYPE_2_VARIANT,
    BlindRSAError,
    Variant,
    blind,
    blind_sign,
    finalize,
    prepare,
    token_key_id,
    verify,
)

VECTORS = json.loads((Path(__file__).parent / "blindrsa_vectors.json").read_text(encoding="utf-8"))
RFC9474 = VECTORS["rfc9474"] + VECTORS["rfc9474_other_transcripts"]
RFC9578 = VECTORS["rfc9578_type2"]
h = bytes.fromhex


def vector_key(v: dict[str, str]) -> rsa.RSAPrivateKey:
    p, q, d, e, n = (int(v[k], 16) for k in "pqden")
    assert p * q == n
    public = rsa.RSAPublicNumbers(e, n)
    return rsa.RSAPrivateNumbers(p, q, d, rsa.rsa_crt_dmp1(d, p), rsa.rsa_crt_dmq1(d, q),
                                 rsa.rsa_crt_iqmp(p, q), public).private_key()


def seeded(seed: int) -> B.Rng:
    """A reproducible byte source (tests only: never for real tokens)."""
    return random.Random(seed).randbytes


class Scripted:
    """An rng that hands out the given byte strings in order, checking each requested length."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    def __call__(self, n: int) -> bytes:
        chunk = self.chunks.pop(0)
        assert len(chunk) == n
        return chunk


def flip(b: bytes, i: int) -> bytes:
    """``b`` with the low bit of byte ``i`` flipped."""
    return b[:i] + bytes([b[i] ^ 1]) + b[i + 1:]


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def vkey() -> rsa.RSAPrivateKey:
    return vector_key(VECTORS["rfc9474"][0])


def issue(sk: rsa.RSAPrivateKey, msg: bytes, variant: Variant, rng: B.Rng | None = None) -> dict:
    """One full protocol run; every value either party saw."""
    kw = {} if rng is None else {"rng": rng}
    prepared = prepare(msg, variant.randomized, **kw)
    blinded, inv = blind(sk.public_key(), prepared, variant=variant, **kw)
    blind_sig = blind_sign(sk, blinded)
    sig = finalize(sk.public_key(), prepared, blind_sig, inv, variant=variant)
    return {"prepared": prepared, "blinded": blinded, "inv": inv, "blind_sig": blind_sig, "sig": sig}


# ----- RFC 9474 Appendix A ------------------------------------------------------------------------


def test_all_four_variants_have_a_vector() -> None:
    assert {Variant.from_name(v["name"]) for v in VECTORS["rfc9474"]} == set(Variant)


@pytest.mark.parametrize("v", RFC9474, ids=[f"{v['name']}-inv{v['inv'][:6]}" for v in RFC9474])
def test_rfc9474_vector(v: dict[str, str]) -> None:
    variant = Variant.from_name(v["name"])
    sk = vector_key(v)
    pk = sk.public_key()
    n = pk.public_numbers().n
    assert variant.randomized == bool(v["msg_prefix"])
    prepared = prepare(h(v["msg"]), variant.randomized, prefix=h(v["msg_prefix"]) if v["msg_prefix"] else None)
    assert prepared.hex() == v["prepared_msg"]
    assert len(h(v["salt"])) == variant.salt_length
    assert B._emsa_pss_encode(prepared, n.bit_length() - 1, h(v["salt"])).hex() == v["encoded_msg"]
    inv = int(v["inv"], 16)
    blinded, inv_out = blind(pk, prepared, variant=variant, salt=h(v["salt"]), r=pow(inv, -1, n))
    assert blinded.hex() == v["blinded_msg"]
    assert inv_out == inv
    blind_sig = blind_sign(sk, blinded)
    assert blind_sig.hex() == v["blind_sig"]
    sig = finalize(pk, prepared, blind_sig, inv, variant=variant)
    assert sig.hex() == v["sig"]
    assert verify(pk, prepared, sig, variant=variant)


def test_rng_alone_reproduces_the_randomized_vector() -> None:
    """The rng argument is enough to replay A.1: prefix, salt, then r, in that order."""
    v = VECTORS["rfc9474"][0]
    variant = Variant.from_name(v["name"])
    assert variant is Variant.SHA384_PSS_RANDOMIZED
    pk = vector_key(v).public_key()
    n = pk.public_numbers().n
    prepared = prepare(h(v["msg"]), True, Scripted(h(v["msg_prefix"])))
    r = pow(int(v["inv"], 16), -1, n)  # a 4096-bit n: r's 512 bytes are exactly what the sampler reads
    blinded, _ = blind(pk, prepared, Scripted(h(v["salt"]), r.to_bytes(512, "big")), variant=variant)
    assert blinded.hex() == v["blinded_msg"]


# ----- RFC 9578 token type 0x0002 -----------------------------------------------------------------


@pytest.mark.parametrize("v", RFC9578["vectors"], ids=[f"vector{i + 1}" for i in range(len(RFC9578["vectors"]))])
def test_rfc9578_token_type_2_vector(v: dict[str, str]) -> None:
    sk = serialization.load_pem_private_key(h(RFC9578["skS"]), password=None)
    assert isinstance(sk, rsa.RSAPrivateKey)
    pk = sk.public_key()
    assert B.public_key_spki(pk).hex() == RFC9578["pkS"]
    assert serialization.load_der_public_key(h(RFC9578["pkS"])).public_numbers() == pk.public_numbers()
    token, request = h(v["token"]), h(v["token_request"])
    key_id = token_key_id(pk)
    assert key_id == hashlib.sha256(h(RFC9578["pkS"])).digest() == token[66:98]
    assert request[:2] == token[:2] == b"\x00\x02"
    assert request[2] == key_id[-1]  # truncated_token_key_id
    token_input = b"\x00\x02" + h(v["nonce"]) + hashlib.sha256(h(v["token_challenge"])).digest() + key_id
    assert token_input == token[:98]
    blinded, inv = blind(pk, token_input, variant=TOKEN_TYPE_2_VARIANT, salt=h(v["salt"]), r=int(v["blind"], 16))
    assert blinded == request[3:]
    blind_sig = blind_sign(sk, blinded)
    assert blind_sig.hex() == v["token_response"]
    assert finalize(pk, token_input, blind_sig, inv, variant=TOKEN_TYPE_2_VARIANT) == token[98:]
    assert verify(pk, token_input, token[98:], variant=TOKEN_TYPE_2_VARIANT)


def test_token_key_id_depends_on_the_key(key: rsa.RSAPrivateKey, vkey: rsa.RSAPrivateKey) -> None:
    assert len(token_key_id(key.public_key())) == 32
    assert token_key_id(key.public_key()) != token_key_id(vkey.public_key())


# ----- round trips with a fresh 2048-bit key ------------------------------------------------------


@pytest.mark.parametrize("variant", list(Variant), ids=lambda v: v.rfc_name)
def test_round_trip(key: rsa.RSAPrivateKey, variant: Variant) -> None:
    msg = b"report token for round 7"
    run = issue(key, msg, variant)
    assert len(run["blinded"]) == len(run["blind_sig"]) == len(run["sig"]) == 256
    assert run["prepared"][-len(msg):] == msg
    assert len(run["prepared"]) == len(msg) + (32 if variant.randomized else 0)
    assert verify(key.public_key(), run["prepared"], run["sig"], variant=variant)
    assert run["blind_sig"] != run["sig"]
    other = next(v for v in Variant if v.salt_length != variant.salt_length)
    assert not verify(key.public_key(), run["prepared"], run["sig"], variant=other)


def test_only_psszero_deterministic_signs_deterministically(key: rsa.RSAPrivateKey) -> None:
    msg = b"high-entropy token input"
    for variant in Variant:
        sigs = {issue(key, msg, variant)["sig"] for _ in range(2)}
        assert len(sigs) == (1 if variant is Variant.SHA384_PSSZERO_DETERMINISTIC else 2), variant.rfc_name


# ----- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", [Variant.SHA384_PSS_DETERMINISTIC, Variant.SHA384_PSSZERO_RANDOMIZED],
                         ids=lambda v: v.rfc_name)
def test_tampering_is_refused(key: rsa.RSAPrivateKey, vkey: rsa.RSAPrivateKey, variant: Variant) -> None:
    pk = key.public_key()
    run = issue(key, b"message", variant)
    prepared, sig, blind_sig, inv = run["prepared"], run["sig"], run["blind_sig"], run["inv"]
    assert not verify(pk, prepared + b"x", sig, variant=variant)
    assert not verify(pk, flip(prepared, 0), sig, variant=variant)
    assert not verify(pk, prepared, flip(sig, 255), variant=variant)
    assert not verify(vkey.public_key(), prepared, sig, variant=variant)
    with pytest.raises(BlindRSAError, match="invalid signature"):
        finalize(pk, prepared, flip(blind_sig, 100), inv, variant=variant)
    with pytest.raises(BlindRSAError, match="invalid signature"):
        finalize(pk, prepared, blind_sig, inv + 1, variant=variant)
    with pytest.raises(BlindRSAError, match="invalid signature"):
        finalize(pk, prepared + b"x", blind_sig, inv, variant=variant)
    # the signer cannot tell a tampered blinded message, but the client's finalize refuses the result
    tampered_sig = blind_sign(key, flip(run["blinded"], 200))
    with pytest.raises(BlindRSAError, match="invalid signature"):
        finalize(pk, prepared, tampered_sig, inv, variant=variant)


def test_blind_sign_checks_its_input(key: rsa.RSAPrivateKey) -> None:
    n = key.public_key().public_numbers().n
    for bad in (b"\x01" * 255, b"\x01" * 257, b""):
        with pytest.raises(BlindRSAError, match="unexpected input size"):
            blind_sign(key, bad)
    for too_big in (n, n + 1, 2**2048 - 1):
        with pytest.raises(BlindRSAError, match="out of range"):
            blind_sign(key, too_big.to_bytes(256, "big"))
    assert blind_sign(key, (n - 1).to_bytes(256, "big"))  # the largest representative is fine


def test_blind_sign_refuses_a_faulty_private_key_operation(key: rsa.RSAPrivateKey,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    blinded, _ = blind(key.public_key(), b"m", variant=Variant.SHA384_PSS_DETERMINISTIC)
    good = B._rsasp1
    monkeypatch.setattr(B, "_rsasp1", lambda sk, m: good(sk, m) + 1)
    with pytest.raises(BlindRSAError, match="signing failure"):
        blind_sign(key, blinded)


def test_rsasp1_is_textbook_rsa(key: rsa.RSAPrivateKey) -> None:
    """CRT plus the signer's base blinding give exactly m^d mod n."""
    priv = key.private_numbers()
    n = priv.public_numbers.n
    draw = random.Random(5).randrange
    for m in (0, 1, 2, n - 1, *(draw(n) for _ in range(5))):
        assert B._rsasp1(key, m) == pow(m, priv.d, n)


def test_finalize_checks_its_input(key: rsa.RSAPrivateKey) -> None:
    variant = Variant.SHA384_PSS_RANDOMIZED
    run = issue(key, b"m", variant)
    n = key.public_key().public_numbers().n
    with pytest.raises(BlindRSAError, match="unexpected input size"):
        finalize(key.public_key(), run["prepared"], run["blind_sig"][1:], run["inv"], variant=variant)
    for inv in (0, n, -run["inv"]):
        with pytest.raises(BlindRSAError, match="inv must be"):
            finalize(key.public_key(), run["prepared"], run["blind_sig"], inv, variant=variant)


def test_prepare_and_blind_check_their_input(vkey: rsa.RSAPrivateKey, monkeypatch: pytest.MonkeyPatch) -> None:
    pk = vkey.public_key()
    numbers = vkey.private_numbers()
    n = numbers.public_numbers.n
    with pytest.raises(BlindRSAError, match="32 bytes"):
        prepare(b"m", True, prefix=b"\x00" * 31)
    assert prepare(b"m", False, prefix=b"ignored") == b"m"
    with pytest.raises(BlindRSAError, match="48-byte salt"):
        blind(pk, b"m", variant=Variant.SHA384_PSS_RANDOMIZED, salt=b"\x00" * 47)
    with pytest.raises(BlindRSAError, match="0-byte salt"):
        blind(pk, b"m", variant=Variant.SHA384_PSSZERO_RANDOMIZED, salt=b"\x00")
    for r in (0, n, n + 5):
        with pytest.raises(BlindRSAError, match="blinding error"):
            blind(pk, b"m", variant=Variant.SHA384_PSS_DETERMINISTIC, r=r)
    with pytest.raises(BlindRSAError, match="no inverse"):  # r = a prime factor of n
        blind(pk, b"m", variant=Variant.SHA384_PSS_DETERMINISTIC, r=numbers.p)
    monkeypatch.setattr(B, "_emsa_pss_encode", lambda msg, bits, salt: numbers.q.to_bytes(512, "big"))
    with pytest.raises(BlindRSAError, match="invalid input"):  # an encoding that shares a factor with n
        blind(pk, b"m", variant=Variant.SHA384_PSS_DETERMINISTIC)


def test_a_key_too_small_for_the_salt_is_refused() -> None:
    n = (2**127 - 1) * (2**607 - 1)  # two Mersenne primes: a 734-bit modulus, emLen 92 < 48 + 48 + 2
    small = rsa.RSAPublicNumbers(65537, n).public_key()
    with pytest.raises(BlindRSAError, match="encoding error"):
        blind(small, b"m", variant=Variant.SHA384_PSS_DETERMINISTIC)
    blinded, _ = blind(small, b"m", variant=Variant.SHA384_PSSZERO_DETERMINISTIC)  # 92 >= 48 + 0 + 2
    assert len(blinded) == 92


def test_unknown_variant_name() -> None:
    with pytest.raises(BlindRSAError, match="unknown RSABSSA variant"):
        Variant.from_name("RSABSSA-SHA256-PSS-Randomized")


# ----- blindness: what the signer sees --------------------------------------------------------------


def test_same_message_blinded_twice_looks_different_to_the_signer(key: rsa.RSAPrivateKey) -> None:
    """PSSZERO-Deterministic encodes a message the same way every time, so only r hides it: the two
    signer views differ (and differ from the encoded message) while the two signatures are equal."""
    variant = Variant.SHA384_PSSZERO_DETERMINISTIC
    msg = b"the same report"
    a, b = issue(key, msg, variant), issue(key, msg, variant)
    assert a["blinded"] != b["blinded"]
    assert a["blind_sig"] != b["blind_sig"]
    assert a["sig"] == b["sig"]
    encoded = B._emsa_pss_encode(msg, key.key_size - 1, b"")
    assert encoded not in (a["blinded"], b["blinded"])
    assert a["sig"] not in (a["blind_sig"], b["blind_sig"])


def _ks_uniform(xs: list[float]) -> float:
    """Kolmogorov–Smirnov distance between the sample and Uniform(0, 1)."""
    xs = sorted(xs)
    return max(max((i + 1) / len(xs) - x, x - i / len(xs)) for i, x in enumerate(xs))


def test_signer_view_is_uniform_whatever_the_message(key: rsa.RSAPrivateKey) -> None:
    """For two different messages, the blinded values z/n are both Uniform(0, 1) (the view carries
    no information about the message) and are not told apart by a two-sample comparison. Seeded, so
    reproducible; the bound 1.95/sqrt(N) is the KS critical value at level 0.001."""
    n = key.public_key().public_numbers().n
    variant = Variant.SHA384_PSSZERO_DETERMINISTIC  # no salt: all randomness of the view is r's
    N = 300
    views = {}
    for i, msg in enumerate((b"message A", b"message B")):
        rng = seeded(100 + i)
        views[msg] = [int.from_bytes(blind(key.public_key(), msg, rng, variant=variant)[0], "big") / n
                      for _ in range(N)]
        assert _ks_uniform(views[msg]) < 1.95 / math.sqrt(N)
        assert len(set(views[msg])) == N
    a, b = sorted(views[b"message A"]), sorted(views[b"message B"])
    two_sample = max(abs(sum(x <= t for x in a) - sum(x <= t for x in b)) / N for t in a + b)
    assert two_sample < 1.95 * math.sqrt(2 / N)


def test_blinding_factor_is_rejection_sampled() -> None:
    """r is uniform on [1, n): an out-of-range draw is redrawn, never reduced mod n (that would bias)."""
    n = 1000  # 10 bits in 2 bytes: 6 excess bits are dropped
    rng = Scripted((1023 << 6).to_bytes(2, "big"), (0).to_bytes(2, "big"), (999 << 6).to_bytes(2, "big"))
    assert B._random_below(n, rng) == 999
    rng = seeded(3)
    counts = Counter(B._random_below(13, rng) for _ in range(13_000))
    assert set(counts) == set(range(1, 13))
    chi2 = sum((c - 13_000 / 12) ** 2 / (13_000 / 12) for c in counts.values())
    assert chi2 < 31.3  # 11 degrees of freedom, level 0.001
