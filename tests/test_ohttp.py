"""Oblivious HTTP (:mod:`hybriddp.core.ohttp`, RFC 9458): round trips, the §4.3/§4.4 construction re-derived
step by step with `cryptography`'s own HKDF and AES-GCM, refusal of unknown keys, tampering and responses for
another request, and key configurations (§3.1, §3.2). Interop with another implementation: test_ohttp_interop.py."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from hybriddp.core import bhttp, hpke, ohttp
from hybriddp.core.errors import DataError


@pytest.fixture(scope="module")
def key() -> ohttp.GatewayKey:
    return ohttp.GatewayKey.generate(key_id=5)


def _req(content: bytes = b'{"message": {}}') -> bytes:
    return bhttp.encode_request("POST", "https", "", "/api/v1/rounds/r/reports",
                                [("content-type", "application/json")], content)


@pytest.mark.parametrize("size", [0, 1024, 100_000])
def test_round_trip(key: ohttp.GatewayKey, size: int) -> None:
    request = _req(os.urandom(size))
    enc_request, client = ohttp.encapsulate_request(key.config, request)
    assert len(enc_request) == 7 + 65 + len(request) + 16
    got, gateway = ohttp.decapsulate_request(key, enc_request)
    assert got == request and len(bhttp.decode_request(got).content) == size
    response = bhttp.encode_response(200, [("content-type", "application/json")], os.urandom(size))
    enc_response = gateway.seal_response(response)
    assert len(enc_response) == 16 + len(response) + 16
    assert client.open_response(enc_response) == response
    again = gateway.seal_response(response)  # a fresh response nonce each time
    assert again[:16] != enc_response[:16] and client.open_response(again) == response


def test_the_construction_is_rfc_9458_sections_4_3_and_4_4(key: ohttp.GatewayKey) -> None:
    """Re-derive both messages from the RFC's steps, with HKDF and AES-GCM from `cryptography`."""
    request = _req()
    enc_request, client = ohttp.encapsulate_request(key.config, request)
    hdr = bytes([5]) + b"\x00\x10\x00\x01\x00\x01"
    assert enc_request[:7] == hdr == key.config.header()
    enc, ct = enc_request[7:72], enc_request[72:]
    ctx = hpke.setup_base_r(enc, hpke.serialize_private_key(key.private_key), b"message/bhttp request\x00" + hdr)
    assert ctx.open(b"", ct) == request
    secret = ctx.export(b"message/bhttp response", 16)
    assert client.secret == secret and client.enc == enc

    _, gateway = ohttp.decapsulate_request(key, enc_request)
    response = bhttp.encode_response(404, [], b"not here")
    enc_response = gateway.seal_response(response)
    response_nonce, ct = enc_response[:16], enc_response[16:]

    def hkdf(info: bytes, length: int) -> bytes:  # Expand(Extract(salt = enc || response_nonce, secret), info, L)
        return HKDF(hashes.SHA256(), length, enc + response_nonce, info).derive(secret)

    assert AESGCM(hkdf(b"key", 16)).decrypt(hkdf(b"nonce", 12), ct, b"") == response


def test_unknown_key_id_or_suite_is_refused(key: ohttp.GatewayKey) -> None:
    enc_request, _ = ohttp.encapsulate_request(key.config, _req())
    for i, what in ((0, "key id 4"), (2, "KEM 0x0011"), (4, "KDF 0x0000"), (6, "AEAD 0x0000")):
        bad = bytearray(enc_request)
        bad[i] ^= 1
        with pytest.raises(ohttp.UnknownKeyError, match=what):
            ohttp.decapsulate_request(key, bytes(bad))
    other = ohttp.GatewayKey.generate(key_id=5)  # same key id, another key
    with pytest.raises(ohttp.DecryptError, match="does not decrypt"):
        ohttp.decapsulate_request(other, enc_request)


def test_tampered_or_truncated_requests_are_refused(key: ohttp.GatewayKey) -> None:
    enc_request, _ = ohttp.encapsulate_request(key.config, _req())
    for i in (7, 8, 40, 71):  # the encapsulated key: off the curve, or another key
        bad = bytearray(enc_request)
        bad[i] ^= 1
        with pytest.raises(ohttp.OHTTPError):
            ohttp.decapsulate_request(key, bytes(bad))
    for i in (72, len(enc_request) // 2 + 36, len(enc_request) - 1):  # the ciphertext and its tag
        bad = bytearray(enc_request)
        bad[i] ^= 0x80
        with pytest.raises(ohttp.DecryptError):
            ohttp.decapsulate_request(key, bytes(bad))
    for n in (0, 7, 72, 72 + 15):
        with pytest.raises(ohttp.OHTTPError, match="at least 88 bytes"):
            ohttp.decapsulate_request(key, enc_request[:n])
    with pytest.raises(ohttp.DecryptError):
        ohttp.decapsulate_request(key, enc_request[:-1])


def test_a_response_opens_only_under_its_own_request(key: ohttp.GatewayKey) -> None:
    (enc_a, client_a), (enc_b, client_b) = (ohttp.encapsulate_request(key.config, _req()) for _ in range(2))
    (_, gateway_a), (_, gateway_b) = ohttp.decapsulate_request(key, enc_a), ohttp.decapsulate_request(key, enc_b)
    response = bhttp.encode_response(200, [], b"ok")
    for_a = gateway_a.seal_response(response)
    assert client_a.open_response(for_a) == response
    with pytest.raises(ohttp.DecryptError, match="not the answer to this request"):
        client_b.open_response(for_a)
    with pytest.raises(ohttp.DecryptError):
        client_a.open_response(gateway_b.seal_response(response))
    for i in (0, 15, 16, len(for_a) - 1):  # the response nonce, the ciphertext, the tag
        bad = bytearray(for_a)
        bad[i] ^= 1
        with pytest.raises(ohttp.DecryptError):
            client_a.open_response(bytes(bad))
    with pytest.raises(ohttp.DecryptError, match="at least 32 bytes"):
        client_a.open_response(for_a[:31])


def test_key_config_wire_form(key: ohttp.GatewayKey) -> None:
    raw = key.config.to_bytes()
    assert raw == bytes([5]) + b"\x00\x10" + key.public_key + b"\x00\x04\x00\x01\x00\x01" and len(raw) == 74
    assert key.public_key == hpke.serialize_public_key(key.private_key.public_key())
    config = ohttp.KeyConfig.parse(raw)
    assert config == key.config == ohttp.KeyConfig.from_bytes(raw)
    assert (config.key_id, config.kem_id, config.kdf_id, config.aead_id) == (5, 0x10, 1, 1) and config.supported
    assert config.serialize() == raw


def test_key_config_with_several_suites(key: ohttp.GatewayKey) -> None:
    head = bytes([9]) + b"\x00\x10" + key.public_key
    many = head + b"\x00\x0c" + b"\x00\x01\x00\x03" + b"\x00\x03\x00\x02" + b"\x00\x01\x00\x01"
    config = ohttp.KeyConfig.parse(many)
    assert (config.key_id, config.kdf_id, config.aead_id, config.supported) == (9, 1, 1, True)
    unsupported = ohttp.KeyConfig.parse(head + b"\x00\x04\x00\x01\x00\x03")  # ChaCha20Poly1305 only
    assert not unsupported.supported
    with pytest.raises(ohttp.UnknownKeyError, match="only HKDF-SHA256 / AES-128-GCM"):
        ohttp.encapsulate_request(unsupported, b"x")


def test_malformed_key_configs_are_refused(key: ohttp.GatewayKey) -> None:
    raw = key.config.to_bytes()
    x25519 = bytes([1]) + b"\x00\x20" + os.urandom(32) + b"\x00\x08\x00\x01\x00\x01\x00\x01\x00\x03"
    with pytest.raises(ohttp.UnknownKeyError, match="KEM 0x0020"):
        ohttp.KeyConfig.parse(x25519)
    off_curve = raw[:3] + b"\x04" + bytes(64) + raw[68:]
    for bad, message in ((raw[:-1], "length 4 is not"), (raw + b"\x00", "length 4 is not"), (raw[:2], "truncated"),
                         (raw[:60], "truncated"), (raw[:68] + b"\x00\x00", "length 0"),
                         (raw[:68] + b"\x00\x02\x00\x01", "length 2"), (off_curve, "not a point on P-256"),
                         (raw[:3] + b"\x02" + raw[4:], "uncompressed")):
        with pytest.raises(ohttp.OHTTPError, match=message):
            ohttp.KeyConfig.parse(bad)
    with pytest.raises(ohttp.OHTTPError, match=r"0\.\.255"):
        ohttp.KeyConfig(256, key.public_key)


def test_application_ohttp_keys(key: ohttp.GatewayKey) -> None:
    other = ohttp.GatewayKey.generate(key_id=6)
    body = ohttp.encode_key_configs([key.config, other.config])
    assert body[:2] == b"\x00\x4a" and body[76:78] == b"\x00\x4a" and len(body) == 2 * 76
    assert ohttp.parse_key_configs(body) == [key.config, other.config]
    x25519 = bytes([1]) + b"\x00\x20" + os.urandom(32) + b"\x00\x04\x00\x01\x00\x01"
    with_unknown = len(x25519).to_bytes(2, "big") + x25519 + body
    assert ohttp.parse_key_configs(with_unknown) == [key.config, other.config]  # §3.2: skip what is unsupported
    with pytest.raises(ohttp.OHTTPError, match="no key config"):
        ohttp.parse_key_configs(b"")
    with pytest.raises(ohttp.OHTTPError, match="no key config"):
        ohttp.parse_key_configs(with_unknown[:2 + len(x25519)])
    with pytest.raises(ohttp.OHTTPError, match="runs past the end"):
        ohttp.parse_key_configs(body[:-1])
    with pytest.raises(ohttp.OHTTPError, match="2-byte length is missing"):
        ohttp.parse_key_configs(body + b"\x00")
    bad = bytearray(body)
    bad[1] = 0x4B  # a length that takes one byte of the next config
    with pytest.raises(ohttp.OHTTPError):
        ohttp.parse_key_configs(bytes(bad))


def test_gateway_key_storage(key: ohttp.GatewayKey) -> None:
    stored = key.to_bytes()
    assert len(stored) == 33 and stored[0] == 5
    for restored in (ohttp.GatewayKey.from_bytes(stored), ohttp.GatewayKey.from_bytes(stored[1:], key_id=5),
                     ohttp.GatewayKey.from_bytes(key.pkcs8(), key_id=5)):
        assert restored.key_id == 5 and restored.public_key == key.public_key and restored.config == key.config
        enc_request, _ = ohttp.encapsulate_request(key.config, b"hello")
        assert ohttp.decapsulate_request(restored, enc_request)[0] == b"hello"
    with pytest.raises(ohttp.OHTTPError, match="pass key_id="):
        ohttp.GatewayKey.from_bytes(stored[1:])
    with pytest.raises(ohttp.OHTTPError, match="neither a 32-byte scalar nor PKCS#8"):
        ohttp.GatewayKey.from_bytes(b"junk" * 10, key_id=1)
    rsa_der = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(ohttp.OHTTPError, match="not a P-256 key"):
        ohttp.GatewayKey.from_bytes(rsa_der, key_id=1)
    with pytest.raises(ohttp.OHTTPError, match="not P-256"):
        ohttp.GatewayKey(1, ec.generate_private_key(ec.SECP384R1()))
    with pytest.raises(ohttp.OHTTPError, match=r"0\.\.255"):
        ohttp.GatewayKey(-1, key.private_key)
    assert str(key.private_key.private_numbers().private_value) not in repr(key)


def test_media_types_and_error_family() -> None:
    assert (ohttp.REQUEST_MEDIA_TYPE, ohttp.RESPONSE_MEDIA_TYPE, ohttp.KEYS_MEDIA_TYPE) == (
        "message/ohttp-req", "message/ohttp-res", "application/ohttp-keys")
    for error in (ohttp.OHTTPError, ohttp.UnknownKeyError, ohttp.DecryptError):
        assert issubclass(error, DataError)
