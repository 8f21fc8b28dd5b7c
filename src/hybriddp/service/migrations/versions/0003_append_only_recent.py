"""messages_recent becomes append-only: ``seq INTEGER PRIMARY KEY AUTOINCREMENT``, no index on the id.

With random ids, the primary key (round, message id) made every commit rewrite nearly every leaf
page of the table; appended rows touch the last few pages. The ids are deduplicated against the
process's in-memory set (:mod:`hybriddp.service.recent`) and ``messages``' primary key instead.
The rows are copied in key order; the downgrade copies them back (their ids are distinct).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

Key = sa.BigInteger().with_variant(sa.Integer, "sqlite")
COLUMNS = "round_num, message_id, entry, value"


def upgrade() -> None:
    op.create_table(
        "messages_recent_new",
        sa.Column("seq", Key, primary_key=True, autoincrement=True),
        sa.Column("round_num", Key, nullable=False),
        sa.Column("message_id", sa.String(22), nullable=False),
        sa.Column("entry", sa.Integer),
        sa.Column("value", sa.Double),
        sqlite_autoincrement=True,
    )
    op.execute(f"INSERT INTO messages_recent_new ({COLUMNS}) SELECT {COLUMNS} FROM messages_recent "
               "ORDER BY round_num, message_id")
    op.drop_table("messages_recent")
    op.rename_table("messages_recent_new", "messages_recent")


def downgrade() -> None:
    op.create_table(
        "messages_recent_old",
        sa.Column("round_num", Key, nullable=False),
        sa.Column("message_id", sa.String(22), nullable=False),
        sa.Column("entry", sa.Integer),
        sa.Column("value", sa.Double),
        sa.PrimaryKeyConstraint("round_num", "message_id", name="messages_recent_pk"),
        sqlite_with_rowid=False,
    )
    op.execute(f"INSERT INTO messages_recent_old ({COLUMNS}) SELECT {COLUMNS} FROM messages_recent "
               "ORDER BY round_num, message_id")
    op.drop_table("messages_recent")
    op.rename_table("messages_recent_old", "messages_recent")
