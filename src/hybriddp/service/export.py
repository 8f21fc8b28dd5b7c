"""A round's device reports out of the service's database into the lake, and a close counted by Spark.

:func:`export_reports` writes a BLENDER round's stored messages as a Parquet reports directory
(docs/FORMATS.md: one row per report), mapping each stored head-list entry back to the (query, url)
the device reported. :func:`close_with_spark` closes a round (reports are refused from then on),
exports it, counts the export with Spark (:func:`hybriddp.spark.reports.count_reports_spark`),
checks those counts against the database's own and publishes the same results a normal close would
(ALGORITHM.md §6, §7). Reads go through the store's tables; nothing here writes to them except the
close itself (``Store.start_close``/``Store.finish_close``).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from sqlalchemy import select

from hybriddp.core.errors import DataError
from hybriddp.curator.release import CuratorRelease, release_from_documents
from hybriddp.io.parquet_reports import ReportsWriter, atomic_directory
from hybriddp.service import schema as s
from hybriddp.service.store import RoundInfo, Store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_CHUNK = 500_000


def _release(store: Store, info: RoundInfo) -> CuratorRelease:
    if info.kind != "blender":
        raise DataError(f"round {info.id} is a {info.kind} round; only BLENDER rounds have reports to export")
    docs = store.documents(info.id)
    if docs.headlist is None or docs.estimates is None:
        raise DataError(f"round {info.id} has no published head list yet (state {info.state}); publish it first")
    return release_from_documents(json.loads(docs.headlist), json.loads(docs.estimates))


def _stored_reports(store: Store, round_num: int) -> list[tuple[str, int]]:
    """(message id, entry) of every stored report of a round: first reports, then the extra ones (m_C > 1)."""
    x = s.extra_entries.c

    def run(conn: Any) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for t in store._message_tables():
            m = t.c
            out += [(r[0], r[1]) for r in conn.execute(select(m.message_id, m.entry).where(
                m.round_num == round_num, m.entry.is_not(None))).all()]
        out += [(r[0], r[1]) for r in conn.execute(select(x.message_id, x.entry).where(x.round_num == round_num))]
        return out
    return store._read(run)


def export_reports(store: Store, round_id: str, path: str | os.PathLike[str]) -> tuple[int, int]:
    """Write the round's stored reports as a Parquet reports directory at ``path``; (messages, reports)."""
    from hybriddp.spark.reports import entry_table

    info = store.round(round_id)
    release = _release(store, info)
    table = entry_table(release).sort_by("entry")
    q_of, u_of = table.column("q").combine_chunks(), table.column("u").combine_chunks()
    rows = sorted(_stored_reports(store, info.num))  # a message's reports together
    ids = [r[0] for r in rows]
    entries = np.array([r[1] for r in rows], dtype=np.int64)
    pos = np.zeros(len(rows), dtype=np.int32)
    for k in range(1, len(rows)):  # position within the message
        if ids[k] == ids[k - 1]:
            pos[k] = pos[k - 1] + 1
    with atomic_directory(path) as tmp:
        out = ReportsWriter(tmp)
        for a in range(0, len(rows), _CHUNK):
            e = pa.array(entries[a:a + _CHUNK])
            out.add(pa.table({"id": pa.array(ids[a:a + _CHUNK], pa.string()), "pos": pa.array(pos[a:a + _CHUNK]),
                              "headlist": pa.array([release.hash] * len(e), pa.string()),
                              "query": q_of.take(e), "url": u_of.take(e)}))
        out.flush()
    return int((pos == 0).sum()), len(rows)


def close_with_spark(store: Store, round_id: str, path: str | os.PathLike[str],
                     spark: SparkSession | None = None, flagged: str = "hold") -> RoundInfo:
    """Close the round, export its reports to ``path``, count them with Spark, and store the results from those
    counts: published, or held when the anchor check flags them and ``flagged`` is ``hold`` (ALGORITHM.md §7.2)."""
    from hybriddp.service.closing import finish_close
    from hybriddp.spark.reports import count_reports_spark
    from hybriddp.spark.session import spark_session

    info = store.start_close(round_id)
    release = _release(store, info)
    export_reports(store, round_id, path)
    counts = count_reports_spark(spark or spark_session(), release, path).counts
    stored = store.entry_counts(info.num, release.head_list.n_entries)
    if not np.array_equal(counts, stored):
        raise DataError(f"round {round_id}: Spark counted {int(counts.sum())} reports in {path} but the database "
                        f"holds {int(stored.sum())}; the export is incomplete. The round stays closed: run "
                        "`hybriddp round close` (or the server's recovery) to publish from the database")
    return finish_close(store, info, flagged)  # from the database's counts, equal to Spark's
