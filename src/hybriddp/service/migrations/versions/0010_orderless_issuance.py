"""Issuance counts stored without an order (issue 38, docs/TOKENS.md "Storage order"): ``token_issuance`` on SQLite
becomes a WITHOUT ROWID table, so its rows sit in key order (holder, round) instead of the order in which
credentials first asked for a token; PostgreSQL keeps its heap (its order is issuance order, which the random
report times make independent of report order).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_CREATE = ("CREATE TABLE {name} (holder VARCHAR(80) NOT NULL, round_num INTEGER NOT NULL, n_issued BIGINT NOT NULL, "
           "CONSTRAINT token_issuance_pk PRIMARY KEY (holder, round_num)){tail}")


def _rebuild(without_rowid: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.execute(_CREATE.format(name="token_issuance_new", tail=" WITHOUT ROWID" if without_rowid else ""))
    op.execute("INSERT INTO token_issuance_new (holder, round_num, n_issued) SELECT holder, round_num, n_issued "
               "FROM token_issuance ORDER BY holder, round_num")
    op.execute("DROP TABLE token_issuance")
    op.execute("ALTER TABLE token_issuance_new RENAME TO token_issuance")


def upgrade() -> None:
    _rebuild(True)


def downgrade() -> None:
    _rebuild(False)
