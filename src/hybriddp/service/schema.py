"""The service's tables (SQLAlchemy Core). Every statement that uses them lives in :mod:`.store`.

Raw opt-in data (``optin_records``, ``optin_values``) exists only until the round's head list
(or opt-in mean) is published: the publishing transaction deletes it. Reports are stored as
what the devices sent — a random message id and the head-list entries (or the randomized
value) — and nothing else: no address, user agent, time or token (a report token is verified and dropped;
``token_issuance`` counts issued tokens per credential and round, never what was signed). ``entry_counts`` holds the
reports per head-list entry, updated in the same transaction that stores the messages, so
closing a round reads a few hundred rows instead of scanning millions
(:meth:`hybriddp.service.store.Store.recount` recounts from the messages, for audits).

On SQLite a new message is appended to the small ``messages_recent`` first (an id already in
``messages`` or in it is not inserted, so an id is in at most one of the two tables; that table
has no index on the id, :mod:`hybriddp.service.recent` keeps its ids in memory); the writer moves
them to ``messages`` in key order once there are many, and a round's close moves the rest
(:meth:`hybriddp.service.store.Store.settle`). Stored messages are the union of both tables.
PostgreSQL stores straight into ``messages``; its ``messages_recent`` stays empty.

The migrations that create these tables are ``migrations/versions/``; a test checks the two agree.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    true,
)

metadata = MetaData()

Key = BigInteger().with_variant(Integer, "sqlite")
"""An integer key: BIGINT on PostgreSQL, INTEGER on SQLite (so that it aliases the rowid)."""

ROUND_STATES = ("collecting-optin", "building-headlist", "headlist-published", "collecting-reports", "closed",
                "results-held", "results-published", "headlist-empty", "aborted", "deleted")
"""The lifecycle; ``building-headlist`` is the short step while the curator runs (see rounds.py);
``results-held``: the anchor check flagged the results at close and they wait for an administrator (publish them,
or publish them without the flagged entries; ALGORITHM.md §7.2). The last three are ends: the curator's run kept
no record (a charged release), the round was aborted before its head list was published (or its build was
interrupted), or an administrator deleted it."""

rounds = Table(
    "rounds", metadata,
    Column("num", Key, primary_key=True, autoincrement=True),  # internal key used by the big tables
    Column("id", String(32), nullable=False, unique=True),  # public id: 16 random bytes, URL-safe base64
    Column("kind", String(16), nullable=False),  # 'blender' | 'mean'
    Column("name", Text),
    Column("state", String(32), nullable=False),
    Column("params", Text, nullable=False),  # JSON
    Column("created", String(40), nullable=False),
    Column("headlist", Text),  # the device document (JSON), once published
    Column("headlist_hash", String(80)),
    Column("estimates", Text),  # the opt-in estimates document (JSON), once published
    Column("report_counts", Text),  # JSON list: reports per head-list entry, stored at close
    Column("results", Text),  # the result JSON, once published
    Column("closed", String(40)),
    Column("optin_users", BigInteger, nullable=False, server_default="0"),  # enrolled opt-in users
    Column("optin_records", BigInteger, nullable=False, server_default="0"),  # records/values uploaded
    Column("n_messages", BigInteger, nullable=False, server_default="0"),  # distinct messages counted
    Column("n_reports", BigInteger, nullable=False, server_default="0"),  # reports in them
    Column("n_duplicates", BigInteger, nullable=False, server_default="0"),  # retried messages not counted again
    Column("retention_deadline", String(40)),  # raw opt-in data are purged at this UTC time at the latest
    Column("purged", String(40)),  # when the raw opt-in data were purged
    Column("series_num", Key),  # the series the round is a period of (migration 0007), or NULL
    Column("period", Integer),  # its period in that series, from 0
    Index("rounds_kind_state_num", "kind", "state", "num"),  # the newest round of a kind in a state (migration 0005)
    Index("rounds_series_period", "series_num", "period", unique=True),  # one round per period of a series
)

series = Table(
    "series", metadata,  # round series (docs/SERIES.md): a round per period, opened and closed on schedule
    Column("num", Key, primary_key=True, autoincrement=True),
    Column("id", String(32), nullable=False, unique=True),  # public id, as a round's
    Column("kind", String(16), nullable=False),
    Column("name", Text),
    Column("params", Text, nullable=False),  # JSON: every period's round parameters
    Column("start", String(40), nullable=False),  # UTC start of period 0
    Column("period_seconds", Double, nullable=False),
    Column("optin_seconds", Double, nullable=False),  # each period's opt-in window, from its start
    Column("periods", Integer, nullable=False),
    Column("flagged", String(16), nullable=False),  # what a period's close does with flagged results
    Column("retention_hours", Double, nullable=False),
    Column("state", String(16), nullable=False),  # 'active' | 'ended' | 'cancelled'
    Column("created", String(40), nullable=False),
    Column("carry", Integer, nullable=False, server_default="0"),  # periods a selected record stays listed (§13.1)
    Column("admitted", Text),  # JSON: periods per user under the lifetime budget it was computed for
)

optin_tokens = Table(
    "optin_tokens", metadata,
    Column("token_hash", String(64), primary_key=True),  # SHA-256 of the token; the token is never stored
    Column("round_num", Key, nullable=False),
    Column("user_pseudonym", String(64), nullable=False),  # HMAC-SHA256(ledger salt, user)
    Column("seq", BigInteger, nullable=False),  # enrolment order within the round (the user's code)
    Column("n_records", BigInteger, nullable=False, server_default="0"),  # uploaded so far (quota)
    Column("n_bytes", BigInteger, nullable=False, server_default="0"),  # request bytes uploaded so far (quota)
    UniqueConstraint("round_num", "user_pseudonym", name="optin_tokens_one_per_user"),
    Index("optin_tokens_round_seq", "round_num", "seq", unique=True),  # a user's token by code (migration 0011)
)

optin_records = Table(
    "optin_records", metadata,
    Column("id", Key, primary_key=True, autoincrement=True),  # upload order
    Column("round_num", Key, nullable=False),
    Column("user_seq", BigInteger, nullable=False),
    Column("query", Text, nullable=False),
    Column("url", Text),
    Index("optin_records_round", "round_num"),
)

optin_uploads = Table(
    "optin_uploads", metadata,
    Column("round_num", Key, nullable=False),
    Column("user_seq", BigInteger, nullable=False),
    Column("upload_key", String(64), nullable=False),  # the uploader's upload id, or SHA-256 of the batch
    Column("n_records", BigInteger, nullable=False),
    PrimaryKeyConstraint("round_num", "user_seq", "upload_key", name="optin_uploads_pk"),
)

optin_values = Table(
    "optin_values", metadata,
    Column("id", Key, primary_key=True, autoincrement=True),
    Column("round_num", Key, nullable=False),
    Column("user_seq", BigInteger, nullable=False),
    Column("value", Double, nullable=False),
    Index("optin_values_round", "round_num"),
)

messages = Table(
    "messages", metadata,
    Column("round_num", Key, nullable=False),
    Column("message_id", String(22), nullable=False),
    Column("entry", Integer),  # BLENDER: head-list entry of the first report (NULL: no report)
    Column("value", Double),  # mean rounds: the randomized value
    PrimaryKeyConstraint("round_num", "message_id", name="messages_pk"),  # dedup: a retried id is stored once
    sqlite_with_rowid=False,
)

messages_recent = Table(
    "messages_recent", metadata,  # SQLite only: new messages, appended; moved to ``messages`` in key order
    Column("seq", Key, primary_key=True, autoincrement=True),  # (Store.settle); ids deduplicated by service.recent
    Column("round_num", Key, nullable=False),
    Column("message_id", String(22), nullable=False),
    Column("entry", Integer),
    Column("value", Double),
    sqlite_autoincrement=True,
)

extra_entries = Table(
    "extra_entries", metadata,  # BLENDER with m_C > 1: the entries of a message's 2nd, 3rd, ... report
    Column("round_num", Key, nullable=False),
    Column("message_id", String(22), nullable=False),
    Column("entry", Integer, nullable=False),
    Index("extra_entries_round", "round_num"),
)

entry_counts = Table(
    "entry_counts", metadata,  # reports per head-list entry, kept in the transaction that stores them
    Column("round_num", Key, nullable=False),
    Column("entry", Integer, nullable=False),
    Column("n", BigInteger, nullable=False),
    PrimaryKeyConstraint("round_num", "entry", name="entry_counts_pk"),
)

round_keys = Table(
    "round_keys", metadata,  # each round's report-token key (docs/TOKENS.md), made when first asked for
    Column("round_num", Key, primary_key=True),
    Column("public_key", Text, nullable=False),  # base64 SPKI (RSASSA-PSS OID)
    Column("private_key", Text),  # base64 PKCS#8; NULL (and scrubbed) once the round takes no more reports
)

device_credentials = Table(
    "device_credentials", metadata,  # admin-issued device credentials (bearer secrets; only their hash is kept)
    Column("id", Key, primary_key=True, autoincrement=True),
    Column("secret_hash", String(64), nullable=False, unique=True),  # SHA-256 of the credential
    Column("label", Text),
    Column("tokens_per_round", Integer, nullable=False),
    Column("created", String(40), nullable=False),
    Column("revoked", String(40)),
)

token_issuance = Table(
    "token_issuance", metadata,  # tokens issued per admitted holder and round: a count, nothing else
    Column("holder", String(80), nullable=False),  # the admission's key, e.g. "credential:17"
    Column("round_num", Key, nullable=False),
    Column("n_issued", BigInteger, nullable=False),
    PrimaryKeyConstraint("holder", "round_num", name="token_issuance_pk"),
    sqlite_with_rowid=False,  # rows in key order, not in the order credentials first asked (migration 0010)
)

ohttp_keys = Table(
    "ohttp_keys", metadata,  # the OHTTP gateway's key pairs (RFC 9458 §3; spec-v2 §4), server-wide, made at first start
    Column("key_id", Integer, primary_key=True, autoincrement=False),  # the KeyConfig's key_id (0-255)
    Column("private_key", Text, nullable=False),  # base64 of ohttp.GatewayKey.to_bytes()
    Column("created", String(40), nullable=False),
)

ledger_meta = Table(
    "ledger_meta", metadata,
    Column("key", String(64), primary_key=True),  # 'salt', 'lifetime_epsilon', 'lifetime_delta'
    Column("value", Text, nullable=False),
)

ledger_charges = Table(
    "ledger_charges", metadata,
    Column("id", Key, primary_key=True, autoincrement=True),
    Column("user_pseudonym", String(64), nullable=False),
    Column("round_num", Key, nullable=False),
    Column("grp", String(32), nullable=False),
    Column("epsilon", Double, nullable=False),
    Column("delta", Double, nullable=False),
    Column("private", Boolean, nullable=False, server_default=true()),  # false: a seeded round (no privacy)
    Index("ledger_charges_user", "user_pseudonym"),
)
