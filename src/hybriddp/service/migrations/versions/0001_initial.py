"""The first schema: rounds, opt-in tokens and raw opt-in data, reports, the privacy ledger.

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Key = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "rounds",
        sa.Column("num", Key, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(32), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.Text),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
        sa.Column("headlist", sa.Text),
        sa.Column("headlist_hash", sa.String(80)),
        sa.Column("estimates", sa.Text),
        sa.Column("report_counts", sa.Text),
        sa.Column("results", sa.Text),
        sa.Column("closed", sa.String(40)),
        sa.Column("optin_users", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("optin_records", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("n_messages", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("n_reports", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("n_duplicates", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "optin_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("round_num", Key, nullable=False),
        sa.Column("user_pseudonym", sa.String(64), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("round_num", "user_pseudonym", name="optin_tokens_one_per_user"),
    )
    op.create_table(
        "optin_records",
        sa.Column("id", Key, primary_key=True, autoincrement=True),
        sa.Column("round_num", Key, nullable=False),
        sa.Column("user_seq", sa.BigInteger, nullable=False),
        sa.Column("query", sa.Text, nullable=False),
        sa.Column("url", sa.Text),
    )
    op.create_index("optin_records_round", "optin_records", ["round_num"])
    op.create_table(
        "optin_values",
        sa.Column("id", Key, primary_key=True, autoincrement=True),
        sa.Column("round_num", Key, nullable=False),
        sa.Column("user_seq", sa.BigInteger, nullable=False),
        sa.Column("value", sa.Double, nullable=False),
    )
    op.create_index("optin_values_round", "optin_values", ["round_num"])
    op.create_table(
        "messages",
        sa.Column("round_num", Key, nullable=False),
        sa.Column("message_id", sa.String(22), nullable=False),
        sa.Column("entry", sa.Integer),
        sa.Column("value", sa.Double),
        sa.PrimaryKeyConstraint("round_num", "message_id", name="messages_pk"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "extra_entries",
        sa.Column("round_num", Key, nullable=False),
        sa.Column("message_id", sa.String(22), nullable=False),
        sa.Column("entry", sa.Integer, nullable=False),
    )
    op.create_index("extra_entries_round", "extra_entries", ["round_num"])
    op.create_table(
        "entry_counts",
        sa.Column("round_num", Key, nullable=False),
        sa.Column("entry", sa.Integer, nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("round_num", "entry", name="entry_counts_pk"),
    )
    op.create_table(
        "ledger_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "ledger_charges",
        sa.Column("id", Key, primary_key=True, autoincrement=True),
        sa.Column("user_pseudonym", sa.String(64), nullable=False),
        sa.Column("round_num", Key, nullable=False),
        sa.Column("grp", sa.String(32), nullable=False),
        sa.Column("epsilon", sa.Double, nullable=False),
        sa.Column("delta", sa.Double, nullable=False),
    )
    op.create_index("ledger_charges_user", "ledger_charges", ["user_pseudonym"])


def downgrade() -> None:
    for table in ("ledger_charges", "ledger_meta", "entry_counts", "extra_entries", "messages", "optin_values",
                  "optin_records", "optin_tokens", "rounds"):
        op.drop_table(table)
