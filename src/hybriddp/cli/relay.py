"""``hybriddp relay``: the Oblivious HTTP relay (RFC 9458; spec-v2 §4) in front of a service's gateway."""

from __future__ import annotations

import re
from typing import Any

import click

from hybriddp.relay import (
    DEFAULT_BODY_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MIRROR_TTL_S,
    DEFAULT_PORT,
    check_target,
)

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


class ByteSize(click.ParamType):
    """A number of bytes: ``16777216``, ``16MiB``, ``512KiB``, ``1MB`` (KiB/MiB/GiB are powers of 1024)."""

    name = "BYTES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(value))
        if m is None or m.group(2).lower() not in _UNITS:
            self.fail(f"{value!r} is not a size in bytes (such as 16777216, 16MiB or 512KiB)", param, ctx)
        return int(m.group(1)) * _UNITS[m.group(2).lower()]


@click.command("relay")
@click.option("--target", required=True, metavar="URL",
              help="The hybriddp service whose OHTTP gateway this relay forwards to (http:// or https://, e.g. "
                   "https://dp.example.org); encapsulated requests go to URL/ohttp. Required.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 listens on every interface (put a TLS proxy in front).")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--batch-ms", type=click.FloatRange(0, 60_000), default=0.0, show_default=True,
              help="Milliseconds to hold encapsulated requests; each held batch is then forwarded in a uniformly "
                   "random order, so the service cannot match its arrival order to the devices'. 0: forward each "
                   "at once.")
@click.option("--mirror-ttl", type=click.FloatRange(0, 86_400), default=DEFAULT_MIRROR_TTL_S, show_default=True,
              help="Seconds a mirrored document (a round's head list and token key, /ohttp-keys) fetched from the "
                   "target is kept and served to every device behind the relay. 0: fetched for every request.")
@click.option("--max-body-bytes", type=ByteSize(), default=DEFAULT_MAX_BODY_BYTES,
              help="Largest encapsulated request taken, in bytes; suffixes KiB, MiB (1024-based) and KB, MB are "
                   "understood. A larger one is refused with 413. Default: 16MiB (the service's own limit).")
@click.option("--body-timeout", type=click.FloatRange(0.001, 3600), default=DEFAULT_BODY_SECONDS, show_default=True,
              help="Seconds a device has to send its whole request body, from the request's start; a slower one "
                   "gets 408, so clients that trickle a body cannot hold the relay's connections and memory.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True, help="Uvicorn's log level. Access logs (with client addresses) are never written.")
def relay_cmd(target: str, host: str, port: int, batch_ms: float, mirror_ttl: float, max_body_bytes: int,
              body_timeout: float, log_level: str) -> None:
    """Run an Oblivious HTTP relay (RFC 9458) for a hybriddp service's devices.

    Meant to be run by a party other than the service's operator: the relay sees a device's address but not
    what it sends (HPKE-encrypted to the service's gateway key); the service sees what is sent but only the
    relay's address. POST /ohttp forwards the body to TARGET/ohttp with no header but Content-Type. GET
    /ohttp-keys and GET /api/v1/rounds/ID/headlist and /token-key mirror the target's documents (kept
    --mirror-ttl seconds), so every device behind the relay can check it got the same head list. GET /healthz
    answers {"status": "ok"}. Nothing is stored and no access log is written.
    """
    import uvicorn

    from hybriddp.core.errors import parameter_error
    from hybriddp.relay import create_relay_app

    if max_body_bytes < 1024:
        raise parameter_error("--max-body-bytes", max_body_bytes, "at least 1024 bytes")
    target = check_target(target)
    app = create_relay_app(target, batch_ms=batch_ms, mirror_ttl=mirror_ttl, max_body_bytes=max_body_bytes,
                           body_seconds=body_timeout)
    click.echo(f"relaying http://{host}:{port}/ohttp to {target}/ohttp (batch {batch_ms:g} ms, mirror kept "
               f"{mirror_ttl:g} s); Ctrl-C stops")
    # no access log, no proxy headers read: the relay keeps nothing about its clients
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, server_header=False,
                proxy_headers=False, timeout_keep_alive=5)
