"""Report tokens (issue 29, docs/TOKENS.md): per-round token keys, device credentials, issuance counts.

* ``round_keys``: a round's RSA-2048 token key; the private half is set to NULL once the round takes no
  more reports.
* ``device_credentials``: administrator-issued device credentials, by the SHA-256 of the secret, with
  their tokens-per-round limit and revocation time.
* ``token_issuance``: how many tokens each admitted holder got in each round (the limit's count).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

Key = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "round_keys",
        sa.Column("round_num", Key, primary_key=True),
        sa.Column("public_key", sa.Text, nullable=False),
        sa.Column("private_key", sa.Text),
    )
    op.create_table(
        "device_credentials",
        sa.Column("id", Key, primary_key=True, autoincrement=True),
        sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("label", sa.Text),
        sa.Column("tokens_per_round", sa.Integer, nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
        sa.Column("revoked", sa.String(40)),
    )
    op.create_table(
        "token_issuance",
        sa.Column("holder", sa.String(80), nullable=False),
        sa.Column("round_num", Key, nullable=False),
        sa.Column("n_issued", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("holder", "round_num", name="token_issuance_pk"),
    )


def downgrade() -> None:
    op.drop_table("token_issuance")
    op.drop_table("device_credentials")
    op.drop_table("round_keys")
