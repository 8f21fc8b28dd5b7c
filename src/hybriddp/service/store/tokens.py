"""Report tokens in the store (docs/TOKENS.md): each round's token key, device credentials, issuance counts.

* A round's RSA key is made when its head list is published, which commits to it (stored by
  :meth:`RoundStore.finish_build` in the publishing transaction); its private half is set to NULL by
  :meth:`RoundStore._transition` when the round leaves the report states, and scrubbed from the files.
* Device credentials are random bearer secrets, shown once and stored as their SHA-256.
* ``token_issuance`` holds one count per (holder, round), raised by one conditional upsert: two concurrent
  requests cannot take a holder past its limit. Nothing about what was signed is stored.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Connection

from hybriddp.core import tokens
from hybriddp.service import schema as s
from hybriddp.service.errors import ConflictError, NotFoundError, UnauthorizedError
from hybriddp.service.store.rounds import REPORT_STATES, RoundInfo, RoundStore, now

CREDENTIAL_PREFIX = "hdc_"
"""Device credentials look like ``hdc_`` + 43 URL-safe base64 characters (32 random bytes)."""
MAX_TOKENS_PER_ROUND = 10_000_000


class IssuanceLimitError(ConflictError):
    """The holder's tokens for this round are used up."""

    status = 403
    code = "issuance_limit"


@dataclass(frozen=True)
class Credential:
    """A device credential as the administrator sees it (never its secret)."""

    id: int
    label: str | None
    tokens_per_round: int
    created: str
    revoked: str | None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "tokens_per_round": self.tokens_per_round,
                "created": self.created, "revoked": self.revoked}


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


class TokenStore(RoundStore):
    """Round keys, device credentials and issuance counts."""

    # ----- round keys ---------------------------------------------------------------------------
    def round_key(self, round_id: str, *, private: bool = False
                  ) -> tuple[RoundInfo, tokens.RoundKey, rsa.RSAPrivateKey | None]:
        """The round's token key, the one its head list commits to (made when the head list was published), and
        its private key when ``private``.

        :class:`ConflictError` unless the round takes reports (its head list is published and it is not closed),
        or when it was published before keys were committed (it has none: publish a new round)."""
        info, pub_b64, priv_b64 = self._read(lambda conn: self._key_row(conn, round_id))
        if pub_b64 is None:
            raise ConflictError(f"round {round_id} was published before report-token keys were committed to its head "
                                "list (docs/TOKENS.md); it cannot issue tokens. Close it and run a new round")
        rk = tokens.RoundKey(info.id, base64.b64decode(pub_b64))
        if not private:
            return info, rk, None
        if priv_b64 is None:
            raise ConflictError(f"round {round_id} is {info.state!r}: it takes no more reports, so no more tokens "
                                "are issued")
        return info, rk, tokens.load_private(base64.b64decode(priv_b64))

    def _key_row(self, conn: Connection, round_id: str) -> tuple[RoundInfo, str | None, str | None]:
        info = self._taking_reports(conn, round_id)
        row = conn.execute(select(s.round_keys.c.public_key, s.round_keys.c.private_key)
                           .where(s.round_keys.c.round_num == info.num)).first()
        return (info, None, None) if row is None else (info, row[0], row[1])

    def _taking_reports(self, conn: Connection, round_id: str) -> RoundInfo:
        info = self._get(conn, round_id)
        if info.state not in REPORT_STATES:
            raise ConflictError(f"round {round_id} is {info.state!r}: report tokens exist only while a round takes "
                                "reports ('headlist-published' or 'collecting-reports')")
        return info

    # ----- issuance -----------------------------------------------------------------------------
    def charge_tokens(self, holder: str, limit: int, info: RoundInfo, n: int) -> int:
        """Count ``n`` tokens for ``holder`` in the round, up to ``limit`` in all; the tokens it has left.

        :class:`IssuanceLimitError` (nothing counted) if ``n`` more would pass the limit."""
        t = s.token_issuance

        def run(conn: Connection) -> int:
            stmt = self._insert(t).values(holder=holder, round_num=info.num, n_issued=n)
            stmt = stmt.on_conflict_do_update(index_elements=["holder", "round_num"],
                                              set_={"n_issued": t.c.n_issued + n},
                                              where=t.c.n_issued + n <= limit).returning(t.c.n_issued)
            got = conn.execute(stmt).first() if n <= limit else None
            if got is None:
                have = conn.execute(select(t.c.n_issued).where(t.c.holder == holder, t.c.round_num == info.num)
                                    ).scalar()
                more = f"{n} more {'is' if n == 1 else 'are'} refused"
                raise IssuanceLimitError(f"this credential may get {limit} report token(s) in round {info.id} and "
                                         f"has {int(have or 0)}; {more} (a device sends one message per round and "
                                         "re-sends it with the same token when it retries)")
            return limit - int(got[0])
        return self._write(run)

    def tokens_issued(self, round_num: int) -> int:
        """Report tokens issued in the round so far, over every holder."""
        t = s.token_issuance.c
        return int(self._read(lambda conn: conn.execute(select(func.coalesce(func.sum(t.n_issued), 0))
                                                        .where(t.round_num == round_num)).scalar()) or 0)

    # ----- device credentials -------------------------------------------------------------------
    def create_credentials(self, count: int, tokens_per_round: int, label: str | None
                           ) -> list[tuple[Credential, str]]:
        """``count`` new credentials, each with its secret (shown once: only the secrets' hashes are stored)."""
        made = [CREDENTIAL_PREFIX + secrets.token_urlsafe(32) for _ in range(count)]
        created = now()

        def run(conn: Connection) -> list[tuple[Credential, str]]:
            out = []
            for sec in made:
                cid = conn.execute(insert(s.device_credentials).values(
                    secret_hash=secret_hash(sec), label=label, tokens_per_round=tokens_per_round,
                    created=created)).inserted_primary_key[0]
                out.append((Credential(int(cid), label, tokens_per_round, created, None), sec))
            return out
        return self._write(run)

    def credential(self, secret: str | None) -> Credential:
        """The unrevoked credential whose secret is ``secret``; :class:`UnauthorizedError` otherwise."""
        if not secret:
            raise UnauthorizedError("report tokens need a device credential: Authorization: Bearer <credential> "
                                    "(an administrator makes them with `hybriddp credentials create`)")
        c = s.device_credentials.c
        row = self._read(lambda conn: conn.execute(select(s.device_credentials).where(
            c.secret_hash == secret_hash(secret))).first())
        if row is None or row.revoked is not None:
            raise UnauthorizedError("unknown or revoked device credential; ask the administrator for a new one")
        return _credential(row)

    def credentials(self) -> list[Credential]:
        rows = self._read(lambda conn: conn.execute(select(s.device_credentials)
                                                    .order_by(s.device_credentials.c.id)).all())
        return [_credential(r) for r in rows]

    def revoke_credential(self, cred_id: int) -> Credential:
        c = s.device_credentials.c

        def run(conn: Connection) -> Credential:
            conn.execute(update(s.device_credentials).where(c.id == cred_id, c.revoked.is_(None)).values(
                revoked=now()))
            row = conn.execute(select(s.device_credentials).where(c.id == cred_id)).first()
            if row is None:
                raise NotFoundError(f"no device credential {cred_id}; GET /api/v1/device-credentials lists them")
            return _credential(row)
        return self._write(run)


def _credential(row: Any) -> Credential:
    return Credential(int(row.id), row.label, int(row.tokens_per_round), row.created, row.revoked)
