"""An index for the newest round of a kind in given states (the local-search page's lookup, issue 29).

Without it, asking for the newest published round when there is none reads every round.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("rounds_kind_state_num", "rounds", ["kind", "state", "num"])


def downgrade() -> None:
    op.drop_index("rounds_kind_state_num", table_name="rounds")
