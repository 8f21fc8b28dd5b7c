"""HPKE (:mod:`hybriddp.core.hpke`) against RFC 9180 Appendix A.3.1, DHKEM(P-256, HKDF-SHA256), HKDF-SHA256,
AES-128-GCM, base mode: keys derived from ikmE/ikmR (§7.1.3), the shared secret, the key schedule, the
ciphertexts at sequence numbers 0..256 and the exported values; then what must be refused."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand
from hypothesis import given, settings
from hypothesis import strategies as st

from hybriddp.core import hpke
from hybriddp.core.errors import DataError

# RFC 9180 Appendix A.3.1 (mode 0, kem_id 16, kdf_id 1, aead_id 1).
INFO = bytes.fromhex("4f6465206f6e2061204772656369616e2055726e")
IKM_E = bytes.fromhex("4270e54ffd08d79d5928020af4686d8f6b7d35dbe470265f1f5aa22816ce860e")
PK_EM = bytes.fromhex("04a92719c6195d5085104f469a8b9814d5838ff72b60501e2c4466e5e67b32"
                      "5ac98536d7b61a1af4b78e5b7f951c0900be863c403ce65c9bfcb9382657222d18c4")
SK_EM = bytes.fromhex("4995788ef4b9d6132b249ce59a77281493eb39af373d236a1fe415cb0c2d7beb")
IKM_R = bytes.fromhex("668b37171f1072f3cf12ea8a236a45df23fc13b82af3609ad1e354f6ef817550")
PK_RM = bytes.fromhex("04fe8c19ce0905191ebc298a9245792531f26f0cece2460639e8bc39cb7f70"
                      "6a826a779b4cf969b8a0e539c7f62fb3d30ad6aa8f80e30f1d128aafd68a2ce72ea0")
SK_RM = bytes.fromhex("f3ce7fdae57e1a310d87f1ebbde6f328be0a99cdbcadf4d6589cf29de4b8ffd2")
ENC = PK_EM
SHARED_SECRET = bytes.fromhex("c0d26aeab536609a572b07695d933b589dcf363ff9d93c93adea537aeabb8cb8")
KEY = bytes.fromhex("868c066ef58aae6dc589b6cfdd18f97e")
BASE_NONCE = bytes.fromhex("4e0bc5018beba4bf004cca59")
EXPORTER_SECRET = bytes.fromhex("14ad94af484a7ad3ef40e9f3be99ecc6fa9036df9d4920548424df127ee0d99f")
PT = bytes.fromhex("4265617574792069732074727574682c20747275746820626561757479")
ENCRYPTIONS = {  # sequence number → (nonce, ct); aad = "Count-<sequence number>"
    0: ("4e0bc5018beba4bf004cca59",
        "5ad590bb8baa577f8619db35a36311226a896e7342a6d836d8b7bcd2f20b6c7f9076ac232e3ab2523f39513434"),
    1: ("4e0bc5018beba4bf004cca58",
        "fa6f037b47fc21826b610172ca9637e82d6e5801eb31cbd3748271affd4ecb06646e0329cbdf3c3cd655b28e82"),
    2: ("4e0bc5018beba4bf004cca5b",
        "895cabfac50ce6c6eb02ffe6c048bf53b7f7be9a91fc559402cbc5b8dcaeb52b2ccc93e466c28fb55fed7a7fec"),
    4: ("4e0bc5018beba4bf004cca5d",
        "8787491ee8df99bc99a246c4b3216d3d57ab5076e18fa27133f520703bc70ec999dd36ce042e44f0c3169a6a8f"),
    255: ("4e0bc5018beba4bf004ccaa6",
          "2ad71c85bf3f45c6eca301426289854b31448bcf8a8ccb1deef3ebd87f60848aa53c538c30a4dac71d619ee2cd"),
    256: ("4e0bc5018beba4bf004ccb59",
          "10f179686aa2caec1758c8e554513f16472bd0a11e2a907dde0b212cbe87d74f367f8ffe5e41cd3e9962a6afb2"),
}
EXPORTS = [  # (exporter_context, L, exported_value)
    (b"", 32, "5e9bc3d236e1911d95e65b576a8a86d478fb827e8bdfe77b741b289890490d4d"),
    (bytes.fromhex("00"), 32, "6cff87658931bda83dc857e6353efe4987a201b849658d9b047aab4cf216e796"),
    (bytes.fromhex("54657374436f6e74657874"), 32, "d8f1ea7942adbba7412c6d431c62d01371ea476b823eb697e1f6e6cae1dab85a"),
]


def _vector_sender() -> tuple[bytes, hpke.SenderContext]:
    return hpke.setup_base_s(PK_RM, INFO, sk_e=hpke.derive_key_pair(IKM_E))


def test_derive_key_pair_reproduces_the_vector_keys() -> None:
    sk_e, sk_r = hpke.derive_key_pair(IKM_E), hpke.derive_key_pair(IKM_R)
    assert hpke.serialize_private_key(sk_e) == SK_EM and hpke.serialize_public_key(sk_e.public_key()) == PK_EM
    assert hpke.serialize_private_key(sk_r) == SK_RM and hpke.serialize_public_key(sk_r.public_key()) == PK_RM
    assert hpke.serialize_private_key(hpke.deserialize_private_key(SK_RM)) == SK_RM


def test_encap_decap_and_key_schedule_match_the_vector() -> None:
    shared_secret, enc = hpke.encap(PK_RM, sk_e=hpke.deserialize_private_key(SK_EM))
    assert (shared_secret, enc) == (SHARED_SECRET, ENC)
    assert hpke.decap(ENC, SK_RM) == SHARED_SECRET
    assert hpke.decap(ENC, hpke.deserialize_private_key(SK_RM), pk_r_bytes=PK_RM) == SHARED_SECRET
    assert hpke.key_schedule(SHARED_SECRET, INFO) == (KEY, BASE_NONCE, EXPORTER_SECRET)
    enc, sender = _vector_sender()
    assert enc == ENC and (sender.key, sender.base_nonce, sender.exporter_secret) == (KEY, BASE_NONCE,
                                                                                       EXPORTER_SECRET)
    recipient = hpke.setup_base_r(ENC, SK_RM, INFO)
    assert (recipient.key, recipient.base_nonce, recipient.exporter_secret) == (KEY, BASE_NONCE, EXPORTER_SECRET)


def test_the_sequence_of_ciphertexts_matches_the_vector() -> None:
    """Seal and open 257 messages in order (aad "Count-i"); the listed sequence numbers give the RFC's bytes."""
    _, sender = _vector_sender()
    recipient = hpke.setup_base_r(ENC, hpke.deserialize_private_key(SK_RM), INFO)
    for seq in range(257):
        aad = f"Count-{seq}".encode()
        assert sender.seq == recipient.seq == seq
        ct = sender.seal(aad, PT)
        if seq in ENCRYPTIONS:
            nonce, expected = ENCRYPTIONS[seq]
            assert sender.compute_nonce(seq).hex() == nonce
            assert ct.hex() == expected
        assert recipient.open(aad, ct) == PT
    assert sender.seq == recipient.seq == 257


@pytest.mark.parametrize(("context", "length", "value"), EXPORTS)
def test_exports_match_the_vector(context: bytes, length: int, value: str) -> None:
    _, sender = _vector_sender()
    recipient = hpke.setup_base_r(ENC, SK_RM, INFO)
    assert sender.export(context, length).hex() == value == recipient.export(context, length).hex()


def test_open_refuses_wrong_aad_tampering_and_the_wrong_order() -> None:
    _, sender = _vector_sender()
    ct0, ct1 = sender.seal(b"a", b"first"), sender.seal(b"b", b"second")
    recipient = hpke.setup_base_r(ENC, SK_RM, INFO)
    with pytest.raises(hpke.OpenError, match="not authentic"):
        recipient.open(b"b", ct1)  # out of order: seq 0's nonce
    with pytest.raises(hpke.OpenError):
        recipient.open(b"x", ct0)
    with pytest.raises(hpke.OpenError):
        recipient.open(b"a", ct0[:-1] + bytes([ct0[-1] ^ 1]))
    with pytest.raises(DataError):  # the family callers catch
        recipient.open(b"a", ct0[:10])
    assert recipient.seq == 0  # failures do not advance the sequence
    assert recipient.open(b"a", ct0) == b"first" and recipient.open(b"b", ct1) == b"second"
    other = hpke.setup_base_r(ENC, SK_RM, INFO + b"!")  # another info: another context
    with pytest.raises(hpke.OpenError):
        other.open(b"a", ct0)


def test_round_trip_with_fresh_keys() -> None:
    sk = hpke.generate_key_pair()
    pk = hpke.serialize_public_key(sk.public_key())
    assert len(pk) == hpke.N_PK and pk[0] == 4
    enc1, s1 = hpke.setup_base_s(pk, b"info")
    enc2, _ = hpke.setup_base_s(pk, b"info")
    assert enc1 != enc2 and len(enc1) == hpke.N_ENC  # a fresh ephemeral key each time
    r = hpke.setup_base_r(enc1, sk, b"info")
    msg = os.urandom(1000)
    assert r.open(b"", s1.seal(b"", msg)) == msg
    assert s1.export(b"ctx", 100) == r.export(b"ctx", 100)


def test_message_limit() -> None:
    _, sender = _vector_sender()
    sender.seq = (1 << 96) - 1
    with pytest.raises(hpke.MessageLimitReachedError):
        sender.seal(b"", b"x")


def test_export_length_bounds() -> None:
    _, sender = _vector_sender()
    assert len(sender.export(b"", 255 * 32)) == 255 * 32
    with pytest.raises(hpke.HPKEError):
        sender.export(b"", 255 * 32 + 1)


@pytest.mark.parametrize("bad", [
    b"", PK_RM[:-1], PK_RM + b"\x00", b"\x02" + PK_RM[1:33],  # lengths; a compressed point
    b"\x04" + bytes(64),  # not on the curve (the identity has no uncompressed form)
    PK_RM[:-1] + bytes([PK_RM[-1] ^ 1]),  # y off by one bit: not on the curve
    b"\x03" + PK_RM[1:],
])
def test_public_keys_off_the_curve_are_refused(bad: bytes) -> None:
    with pytest.raises(hpke.HPKEError):
        hpke.deserialize_public_key(bad)
    with pytest.raises(hpke.HPKEError):
        hpke.setup_base_s(bad, b"")
    with pytest.raises(hpke.HPKEError):
        hpke.setup_base_r(bad, SK_RM, b"")


@pytest.mark.parametrize("bad", [bytes(32), hpke.P256_ORDER.to_bytes(32, "big"), b"\xff" * 32, SK_RM[:-1]])
def test_private_scalars_out_of_range_are_refused(bad: bytes) -> None:
    with pytest.raises(hpke.HPKEError):
        hpke.deserialize_private_key(bad)


@settings(max_examples=50, deadline=None)
@given(salt=st.binary(max_size=100), ikm=st.binary(max_size=100), info=st.binary(max_size=100),
       length=st.integers(0, 255 * 32))
def test_hkdf_agrees_with_cryptography(salt: bytes, ikm: bytes, info: bytes, length: int) -> None:
    prk = hpke.extract(salt, ikm)
    assert hpke.expand(prk, info, length) == HKDFExpand(hashes.SHA256(), length, info).derive(prk)
    if length:
        assert hpke.expand(prk, info, length) == HKDF(hashes.SHA256(), length, salt or None, info).derive(ikm)


def test_labeled_functions_follow_rfc_9180_section_4() -> None:
    prk = os.urandom(32)
    assert hpke.labeled_extract(b"s", b"lab", b"ikm") == hpke.extract(b"s", b"HPKE-v1" + hpke.SUITE_ID + b"labikm")
    assert hpke.SUITE_ID == b"HPKE\x00\x10\x00\x01\x00\x01" and hpke.KEM_SUITE_ID == b"KEM\x00\x10"
    assert (hpke.labeled_expand(prk, b"lab", b"inf", 40, hpke.KEM_SUITE_ID)
            == hpke.expand(prk, b"\x00\x28HPKE-v1KEM\x00\x10labinf", 40))
