"""A service round exported to Parquet and closed with Spark (issue 12): same counts and results as the database."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from clihelpers import assert_clean_error, invoke
from hybriddp.core.params import BlenderParams
from hybriddp.curator.party import curate
from hybriddp.curator.release import release_from_documents
from hybriddp.device.party import log_messages
from hybriddp.io.parquet_reports import read_parquet_messages
from hybriddp.server.party import MessageCounter, count_messages, serve_estimates
from hybriddp.service.export import close_with_spark
from hybriddp.service.store import Store
from hybriddp.simulation.pipeline import split_optin
from logdata import zipf_log
from storehelpers import published_round


def test_round_exported_and_closed_with_spark(spark, tmp_path: Path) -> None:
    log = zipf_log(n_users=3_000, n_queries=50, seed=6)
    params = BlenderParams(optin_fraction=0.25, head_list_size=12, m_c=2)
    optin, clients = split_optin(log.n_users, params.optin_fraction, 9)
    rel, _ = curate(log, params, optin_users=optin, seed=9)
    served = release_from_documents(*json.loads(json.dumps([rel.headlist, rel.estimates])))
    messages = list(log_messages(log, clients, served.headlist, seed=9))
    counter = MessageCounter(served)
    items = [(m["id"], counter.entries(m)[1]) for m in messages]

    db = tmp_path / "service.db"
    store = Store(f"sqlite:///{db}")
    try:
        rnd = info = published_round(store, headlist=served.headlist, estimates=served.estimates)
        store.add_reports(info, items[:1_000])
        store.add_reports(info, items[900:])  # 100 retries, counted once by the service
        r = invoke("round", "export", rnd.id, "--db", f"sqlite:///{db}", "--output", tmp_path / "cli.parquet")
        assert f"wrote {sum(len(e) for _, e in items):,} reports of {len(items):,} device messages" in r.stdout
        done = close_with_spark(store, rnd.id, tmp_path / "export.parquet", spark)
        assert done.state == "results-published"
        docs = store.documents(rnd.id)
    finally:
        store.close()
    want = count_messages(served, messages)  # counted here, from what the devices sent
    assert json.loads(docs.report_counts) == want.counts.tolist()
    stored = json.loads(docs.results)
    expected = serve_estimates(served, want, defense=None).to_json()  # params {}: a round without a defense
    assert [r["p_blended"] for r in stored["records"]] == [r["p_blended"] for r in expected["records"]]
    again = MessageCounter(served)
    for where, msg in read_parquet_messages(tmp_path / "cli.parquet"):
        again.add(msg, where)
    assert np.array_equal(again.result.counts, want.counts) and again.result.messages == len(messages)


def test_export_errors(tmp_path: Path) -> None:
    r = invoke("round", "export", "abc", "--db", f"sqlite:///{tmp_path / 'missing.db'}", "-o", tmp_path / "x",
               ok=False)
    assert_clean_error(r, "--db", "an existing database")
