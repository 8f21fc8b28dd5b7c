"""Series: carried head lists and the periods per user computed once (issue 30, docs/SERIES.md).

* ``series.carry``: periods a record CreateHeadList selected stays on the series' next head lists (ALGORITHM.md
  §13.1; 0 for series made before, whose lists were each period's own).
* ``series.admitted``: JSON of the periods one opt-in user can take part in under the lifetime budget (basic and
  the ledger's rule) and the budget it was computed for, so that showing a series never runs the PLD accountant.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("series") as batch:
        batch.add_column(sa.Column("carry", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("admitted", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("series") as batch:
        batch.drop_column("admitted")
        batch.drop_column("carry")
