"""Raw opt-in data lifecycle and honest accounting.

* ``rounds.retention_deadline``: UTC time (ISO 8601) after which a round's raw opt-in data are
  purged automatically, whatever its state; ``rounds.purged``: when they were purged.
* ``optin_tokens.n_records`` / ``n_bytes``: what each opt-in token has uploaded (per-token quotas).
* ``optin_uploads``: one row per accepted upload of a token, keyed by the upload's id (given by
  the uploader, or the SHA-256 of the batch), so a repeated upload is acknowledged, not appended.
* ``ledger_charges.private``: false for a seeded (experiment) round, which gives no privacy.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

Key = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.add_column(sa.Column("retention_deadline", sa.String(40)))
        batch.add_column(sa.Column("purged", sa.String(40)))
    with op.batch_alter_table("optin_tokens") as batch:
        batch.add_column(sa.Column("n_records", sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("n_bytes", sa.BigInteger, nullable=False, server_default="0"))
    with op.batch_alter_table("ledger_charges") as batch:
        batch.add_column(sa.Column("private", sa.Boolean, nullable=False, server_default=sa.true()))
    op.create_table(
        "optin_uploads",
        sa.Column("round_num", Key, nullable=False),
        sa.Column("user_seq", sa.BigInteger, nullable=False),
        sa.Column("upload_key", sa.String(64), nullable=False),
        sa.Column("n_records", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("round_num", "user_seq", "upload_key", name="optin_uploads_pk"),
    )


def downgrade() -> None:
    op.drop_table("optin_uploads")
    with op.batch_alter_table("ledger_charges") as batch:
        batch.drop_column("private")
    with op.batch_alter_table("optin_tokens") as batch:
        batch.drop_column("n_bytes")
        batch.drop_column("n_records")
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("purged")
        batch.drop_column("retention_deadline")
