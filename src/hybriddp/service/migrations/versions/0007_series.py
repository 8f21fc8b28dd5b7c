"""Round series (issue 30, docs/SERIES.md): a round per period, opened, published and closed on schedule.

* ``series``: a series' parameters, schedule and state.
* ``rounds.series_num`` and ``rounds.period``: the series and period a round belongs to (NULL for a round of its
  own), unique together so that two schedulers racing for a period create one round.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

Key = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "series",
        sa.Column("num", Key, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(32), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.Text),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("start", sa.String(40), nullable=False),
        sa.Column("period_seconds", sa.Double, nullable=False),
        sa.Column("optin_seconds", sa.Double, nullable=False),
        sa.Column("periods", sa.Integer, nullable=False),
        sa.Column("flagged", sa.String(16), nullable=False),
        sa.Column("retention_hours", sa.Double, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
    )
    op.add_column("rounds", sa.Column("series_num", Key))
    op.add_column("rounds", sa.Column("period", sa.Integer))
    op.create_index("rounds_series_period", "rounds", ["series_num", "period"], unique=True)


def downgrade() -> None:
    op.drop_index("rounds_series_period", table_name="rounds")
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("period")
        batch.drop_column("series_num")
    op.drop_table("series")
