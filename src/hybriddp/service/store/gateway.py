"""The OHTTP gateway's key pair in the store (spec-v2 §4; RFC 9458 §3, HPKE RFC 9180).

One server-wide key pair (``ohttp_keys``), made the first time it is asked for (at the service's start): two
processes starting at once race on one ``INSERT … ON CONFLICT DO NOTHING`` of key id 1, the first insert wins and
both use its key, so every worker of ``serve --workers N`` decapsulates with the same key and serves the same
KeyConfig. The key is kept while the database lives (the head lists published after commit to its KeyConfig).
"""

from __future__ import annotations

import base64

from sqlalchemy import select
from sqlalchemy.engine import Connection

from hybriddp.core import ohttp
from hybriddp.service import schema as s
from hybriddp.service.errors import StoreError
from hybriddp.service.store.engine import StoreBase, describe_url
from hybriddp.service.store.rounds import now

GATEWAY_KEY_ID = 1
"""The KeyConfig ``key_id`` of the gateway key made at first start (RFC 9458 §3.1)."""


class GatewayStore(StoreBase):
    """The gateway's key pair (module docstring)."""

    _gateway: ohttp.GatewayKey | None = None

    def gateway_key(self) -> ohttp.GatewayKey:
        """The gateway's HPKE key pair (its ``.config`` is the public RFC 9458 §3.1 KeyConfig), made now if the
        database has none.

        Guarantee: every process on this database gets the same key (the newest key id; the first insert of a
        race wins and the others read it); it is read once per process and then kept in memory.
        :class:`StoreError` when the stored key cannot be read (a damaged row)."""
        if self._gateway is not None:
            return self._gateway
        row = self._read(self._newest_gateway_row)
        if row is None:
            fresh = ohttp.GatewayKey.generate(key_id=GATEWAY_KEY_ID)
            blob = base64.b64encode(fresh.to_bytes()).decode("ascii")

            def run(conn: Connection) -> tuple[int, str] | None:
                conn.execute(self._insert(s.ohttp_keys).values(key_id=GATEWAY_KEY_ID, private_key=blob, created=now())
                             .on_conflict_do_nothing(index_elements=["key_id"]))
                return self._newest_gateway_row(conn)
            row = self._write(run)
        assert row is not None
        try:
            key = ohttp.GatewayKey.from_bytes(base64.b64decode(row[1], validate=True))
        except (ValueError, TypeError) as exc:  # DataError is a ValueError too
            raise StoreError(f"database {describe_url(self.url)}: the OHTTP gateway key {row[0]} is damaged ({exc}); "
                             "restore the database from a backup") from None
        self._gateway = key
        return key

    def gateway_config(self) -> bytes:
        """The gateway's public KeyConfig (RFC 9458 §3.1, 74 bytes): what a head list commits to as ``ohttp_key``
        (spec-v2 §1, §4); made with the key pair if the database has none (:meth:`gateway_key`)."""
        return self.gateway_key().config.to_bytes()

    @staticmethod
    def _newest_gateway_row(conn: Connection) -> tuple[int, str] | None:
        row = conn.execute(select(s.ohttp_keys.c.key_id, s.ohttp_keys.c.private_key)
                           .order_by(s.ohttp_keys.c.key_id.desc()).limit(1)).first()
        return None if row is None else (int(row[0]), str(row[1]))
