"""The service's storage: every SQL statement of the collection service, on SQLite or PostgreSQL (SQLAlchemy Core).

:class:`Store` offers one method per operation of a round; each is one transaction, and state changes
are conditional ``UPDATE ... WHERE state = ...`` statements, so two requests racing for the same
transition cannot both win. It is composed of one class per concern:

* :mod:`.engine`: the engine, SQLite pragmas, migrations (Alembic ``upgrade head``) and transactions;
* :mod:`.rounds`: the round state machine, documents, abort, delete, purge and scrub of raw opt-in data;
* :mod:`.enrolment`: opt-in users' enrolment and tokens; :mod:`.optin`: idempotent uploads within quotas, the
  build's charge;
* :mod:`.ledger`: the privacy ledger's charges (the budget rule itself is :mod:`hybriddp.privacy.budget`);
* :mod:`.reports`: the deduplicating report path, SQLite's settling, and the counts per entry;
* :mod:`.tokens`: report tokens' round keys, device credentials and issuance counts (docs/TOKENS.md);
* :mod:`.series`: round series and the rounds of their periods (docs/SERIES.md);
* :mod:`.gateway`: the OHTTP gateway's key pair (spec-v2 §4, RFC 9458).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hybriddp.service.store.engine import (
    ADVISORY_LEDGER,
    ADVISORY_MIGRATE,
    DATABASE_URLS,
    DEFAULT_LIFETIME_DELTA,
    DEFAULT_LIFETIME_EPSILON,
    DEFAULT_OPTIN_MAX_BYTES,
    DEFAULT_OPTIN_MAX_RECORDS,
    IN_CHUNK,
    PSYCOPG_NEEDED,
    RETRIES,
    SETTLE_ROWS,
    SQLITE_BUSY_TIMEOUT_MS,
    database_url,
    describe_url,
    make_engine,
    migrate,
)
from hybriddp.service.store.enrolment import token_hash
from hybriddp.service.store.gateway import GatewayStore
from hybriddp.service.store.optin import OptinStore, OptinUpload, TokenUpload, UploadAck
from hybriddp.service.store.reports import SETTLE_CACHE_KIB, SQLITE_CACHE_KIB, ReportAck, ReportStore
from hybriddp.service.store.rounds import (
    DEFAULT_RETENTION_HOURS,
    ENDED_STATES,
    MAX_RETENTION_HOURS,
    REPORT_STATES,
    ROUND_ID,
    RoundDocuments,
    RoundInfo,
    new_round_id,
    now,
)
from hybriddp.service.store.series import SERIES_STATES, SeriesInfo, SeriesStore
from hybriddp.service.store.tokens import Credential, IssuanceLimitError, TokenStore


class Store(OptinStore, ReportStore, TokenStore, SeriesStore, GatewayStore):
    """Every database operation of the collection service: the concerns' classes composed (module docstring);
    its parameters are those of :class:`~hybriddp.service.store.engine.StoreBase`."""


@contextlib.contextmanager
def open_store(url: str, **kw: Any) -> Iterator[Store]:
    """A :class:`Store`, closed on exit."""
    store = Store(url, **kw)
    try:
        yield store
    finally:
        store.close()


__all__ = ["ADVISORY_LEDGER", "ADVISORY_MIGRATE", "DATABASE_URLS", "DEFAULT_LIFETIME_DELTA",
           "DEFAULT_LIFETIME_EPSILON", "DEFAULT_OPTIN_MAX_BYTES", "DEFAULT_OPTIN_MAX_RECORDS",
           "DEFAULT_RETENTION_HOURS", "ENDED_STATES", "IN_CHUNK", "MAX_RETENTION_HOURS", "PSYCOPG_NEEDED",
           "REPORT_STATES", "RETRIES", "ROUND_ID", "SERIES_STATES", "SETTLE_CACHE_KIB", "SETTLE_ROWS",
           "SQLITE_BUSY_TIMEOUT_MS", "SQLITE_CACHE_KIB", "Credential", "IssuanceLimitError",
           "OptinUpload", "ReportAck", "RoundDocuments", "RoundInfo", "SeriesInfo", "Store", "TokenUpload",
           "UploadAck",
           "database_url", "describe_url", "make_engine", "migrate", "new_round_id", "now", "open_store",
           "token_hash"]
