"""The index of an opt-in user's token by its code (issue 39, opt-in at scale): a UNIQUE index on
``optin_tokens(round_num, seq)``.

An upload names its user by the code (``seq``) and reads and updates the token's quota counters by it; without
the index each of those statements scanned the round's tokens, so an NDJSON batch of n users cost O(n²).
The other lookups of enrolment and uploads already have theirs: ``optin_tokens_one_per_user`` (round, pseudonym),
the ``optin_uploads`` primary key (round, user, key), ``optin_records_round``/``optin_values_round`` and
``ledger_charges_user``.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("optin_tokens_round_seq", "optin_tokens", ["round_num", "seq"], unique=True)


def downgrade() -> None:
    op.drop_index("optin_tokens_round_seq", table_name="optin_tokens")
