"""``hybriddp round export``: a round's reports from the service's database to Parquet, optionally closed with Spark."""

from __future__ import annotations

import os

import click

from hybriddp.cli import render
from hybriddp.cli.rounds import round_group
from hybriddp.core.errors import parameter_error


@round_group.command("export")
@click.argument("round_id")
@click.option("--db", "db_url", required=True, metavar="URL",
              help="The collection service's database: sqlite:///PATH or postgresql+psycopg://… (as given to "
                   "`hybriddp serve --db`). Read directly, on the server's machine.")
@click.option("--output", "-o", type=click.Path(), required=True,
              help="Directory to write: Parquet files with one row per report (docs/FORMATS.md), replaced "
                   "whole when complete; a local path (copy it to the lake afterwards).")
@click.option("--close", "close", is_flag=True,
              help="Also close the round: export, count the export with Spark, check the counts against the "
                   "database's, publish the results. Stop the server first (or let no device report meanwhile): "
                   "the close happens in the database directly.")
@click.option("--spark-master", default=None, metavar="URL",
              help="With --close: the Spark master (default: spark-submit's --master, else local[2]).")
@click.option("--flagged", type=click.Choice(["hold", "publish", "remove"]), default="hold", show_default=True,
              help="With --close, when the check against the opt-in group flags the results (docs/ALGORITHM.md "
                   "§7.2): hold them for `round publish-results`, publish them, or publish them without the "
                   "flagged entries.")
def export_cmd(round_id: str, db_url: str, output: str, close: bool, spark_master: str | None,
               flagged: str) -> None:
    """Export a BLENDER round's stored device reports as a Parquet reports directory (docs/SCALE.md);
    with --close, close the round with the Spark engine (ALGORITHM.md §6, §7)."""
    from hybriddp.service.export import close_with_spark, export_reports
    from hybriddp.service.store import Store

    if db_url.startswith("sqlite:///") and not os.path.isfile(db_url[len("sqlite:///"):]):
        raise parameter_error("--db", db_url, "an existing database", "Pass the URL `hybriddp serve --db` uses.")
    store = Store(db_url)
    try:
        if close:
            from hybriddp.spark.session import spark_session
            info = close_with_spark(store, round_id, output, spark_session(spark_master), flagged)
            render.out.print(f"round {round_id}: {info.reports:,} reports exported to {output}, counted with "
                             f"Spark; state {info.state}")
            return
        n_msg, n_rep = export_reports(store, round_id, output)
        render.out.print(f"round {round_id}: wrote {n_rep:,} reports of {n_msg:,} device messages to {output}")
    finally:
        store.close()
