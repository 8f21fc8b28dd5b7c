"""The SDK's shared TLS context links no connections (hybriddp.sdk.http.tls_context; issue 38's promise).

Every SDK connection pool is built with one shared ``ssl.SSLContext`` (building one costs ~40 ms of CPU, and a
device opens a connection for its token and another for its report). A server that could resume the first
connection's TLS session on the second would know both came from one device. The attack: a real TLS server
(Python's ``ssl`` on a self-signed certificate the test trusts through ``SSL_CERT_FILE``, as httpx honours it)
records, for each accepted connection, whether the client resumed an earlier session; a device-like client makes
several fresh pools from the shared context, each with a request. Every connection must be a full handshake.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hybriddp.sdk import http as sdk_http


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[bool]]]:
    """An HTTPS server answering 200 to anything; yields its URL and, per connection, whether it was resumed."""
    cert, key = _self_signed(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)  # session tickets on (OpenSSL's default): resumption is possible if offered
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    resumed: list[bool] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            with ctx.wrap_socket(raw, server_side=True) as conn:
                conn.recv(65536)
                resumed.append(conn.session_reused)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    sdk_http.tls_context.cache_clear()
    try:
        yield f"https://localhost:{port}", resumed
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        sdk_http.tls_context.cache_clear()


def test_fresh_pools_from_the_shared_context_never_resume_a_session(tls_server: tuple[str, list[bool]]) -> None:
    url, resumed = tls_server
    ctx = sdk_http.tls_context()
    for _ in range(4):  # a device's head-list, token and report connections, and one more
        with sdk_http.new_client(10.0) as client:
            assert client.get(url + "/health").status_code == 200
    assert sdk_http.tls_context() is ctx  # one context for all of them
    assert resumed == [False] * 4


def test_the_server_would_see_a_resumption_were_it_offered(tls_server: tuple[str, list[bool]]) -> None:
    """The check can fail: a client that does pass the first session on is seen resuming by the same server."""
    url, resumed = tls_server
    host, port = url.removeprefix("https://").split(":")
    ctx = sdk_http.tls_context()
    session = None
    for _ in range(2):
        with socket.create_connection((host, int(port))) as raw, \
                ctx.wrap_socket(raw, server_hostname=host, session=session) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            conn.recv(65536)  # TLS 1.3 sends its ticket after the handshake: read before taking the session
            session = conn.session
    assert resumed == [False, True]
