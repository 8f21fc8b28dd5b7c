"""The seam: curator / device / server as library functions, and their composition (issue: seam).

* ``run_blender`` equals curate → device messages → count_messages → serve_estimates, exactly;
* the release's two documents are hash-bound and validated field by field;
* the server counts a repeated message id once and refuses a message with more than m_C reports;
* the ledger's charges and the printed guarantee come from the same numbers;
* a reports file without its end line (truncated) is refused.
"""

from __future__ import annotations

import copy
import gzip
import json

import numpy as np
import pytest

from hybriddp.core.errors import DataError, HeadListError, HybridDPError
from hybriddp.core.params import BlenderParams
from hybriddp.core.protocol import new_message_id
from hybriddp.curator.party import curate
from hybriddp.curator.release import release_from_documents
from hybriddp.device.localalg import DeviceHeadList, SeededSource
from hybriddp.device.party import device_message, log_messages
from hybriddp.io.exchange import read_messages, write_reports
from hybriddp.privacy.guarantees import describe
from hybriddp.server.party import count_messages, serve_estimates
from hybriddp.simulation.pipeline import round_charges, run_blender, split_optin
from logdata import zipf_log

PARAMS = BlenderParams(optin_fraction=0.1, head_list_size=20)


@pytest.fixture(scope="module")
def log():
    return zipf_log(n_users=6_000, n_queries=80, seed=5)


@pytest.fixture(scope="module")
def release(log):
    rel, _ = curate(log, PARAMS, seed=3)
    return rel


def test_run_blender_is_the_composition_of_the_three_parties(log) -> None:
    """Same seed: the simulation and the party functions (with the documents' JSON round trip and
    the device code replaying the batch randomizer's draws) give bit-identical estimates."""
    run = run_blender(log, PARAMS, seed=21)
    optin, clients = split_optin(log.n_users, PARAMS.optin_fraction, 21)
    rel, _ = curate(log, PARAMS, optin_users=optin, seed=21)
    docs = json.loads(json.dumps([rel.headlist, rel.estimates]))
    served = release_from_documents(*docs)
    counts = count_messages(served, log_messages(log, clients, served.headlist, seed=21))
    res = serve_estimates(served, counts)
    assert np.array_equal(counts.counts, run.report_counts)
    assert np.array_equal(res.p_record, run.blended.records_final)
    assert np.array_equal(res.p_query, run.blended.queries_final)
    assert np.array_equal(res.optin.var_record, run.curator.optin.var_record)


def test_release_documents_are_bound_and_validated(release) -> None:
    h, e = release.headlist, release.estimates
    assert e["headlist"] == h["content_hash"] and e["content_hash"].startswith("sha256:")
    back = release_from_documents(copy.deepcopy(h), copy.deepcopy(e))
    assert np.array_equal(back.optin.p_record, release.optin.p_record)
    assert np.array_equal(back.optin.var_query, release.optin.var_query)
    assert back.charges == []  # the server never learns who the opt-in users were

    def broken(field: str, value: object) -> dict:
        d = copy.deepcopy(e)
        d[field] = value
        from hybriddp.core.protocol import content_hash
        d["content_hash"] = content_hash(d)  # a well-formed but wrong document
        return d

    for field, value in [("n", -1), ("n", 1.5), ("n", True), ("noise_variance", -2.0), ("noise_variance", None),
                         ("p_record", [None] * len(e["p_record"])), ("p_record", e["p_record"][:-1]),
                         ("draws_record", [0] * len(e["draws_record"])), ("p_query", "x"), ("noise", "gauss"),
                         ("seed", -4), ("params", {"epsilon": "4"}), ("params", {"bogus": 1}), ("sizes", {"a": -1})]:
        with pytest.raises(DataError, match=field.split("_")[0]):
            release_from_documents(h, broken(field, value))
    tampered = copy.deepcopy(e)
    tampered["p_record"][0] += 0.1
    with pytest.raises(DataError, match="content_hash"):
        release_from_documents(h, tampered)
    other = copy.deepcopy(h)
    other["m_c"] = 2
    from hybriddp.core.protocol import content_hash
    other["content_hash"] = content_hash(other)
    with pytest.raises(HeadListError, match="head list"):
        release_from_documents(other, e)


def test_reuse_release_round_trips_and_is_validated(log) -> None:
    """A release that reuses S (ALGORITHM.md §4.1) is version 3: its variances come back exactly from the
    documents, the run equals the parties through the documents, and a bad ``reused``/``n_s`` or an
    estimator that does not match the version is refused by name."""
    from dataclasses import replace

    from hybriddp.core.protocol import content_hash

    params = replace(PARAMS, estimator="reuse")
    run = run_blender(log, params, seed=21)
    optin, clients = split_optin(log.n_users, params.optin_fraction, 21)
    rel, _ = curate(log, params, optin_users=optin, seed=21)
    h, e = json.loads(json.dumps([rel.headlist, rel.estimates]))
    assert e["version"] == 3 and e["n_s"] == run.curator.optin.n_s > 0
    assert e["s_corrected"] is True  # S's counts corrected for having passed τ (ALGORITHM.md §4.1)
    back = release_from_documents(h, e)
    assert back.optin.kept == run.curator.optin.kept is not None
    assert np.array_equal(back.optin.var_record, run.curator.optin.var_record)
    assert np.array_equal(back.optin.var_query, run.curator.optin.var_query)
    assert back.optin.reused.sum() == back.head_list.n_records  # every kept record reuses its S count
    res = serve_estimates(back, count_messages(back, log_messages(log, clients, back.headlist, seed=21)))
    assert np.array_equal(res.p_record, run.blended.records_final)

    def broken(**fields: object) -> dict:
        d = copy.deepcopy(e)
        d.update(fields)
        d["content_hash"] = content_hash(d)
        return d

    star = len(e["reused"]) - 1  # ⟨*,*⟩ is never reused
    for fields, match in [({"reused": e["reused"][:-1]}, "reused"), ({"reused": [2] * len(e["reused"])}, "reused"),
                          ({"reused": [*e["reused"][:-1], 1]}, f"entry {star}"), ({"n_s": -1}, "n_s"),
                          ({"version": 2}, "estimator"), ({"version": 4}, "version"),
                          ({"params": {**e["params"], "estimator": "pooled"}}, "estimator"),
                          ({"s_corrected": "yes"}, "s_corrected")]:
        with pytest.raises(DataError, match=match):
            release_from_documents(h, broken(**fields))
    with pytest.raises(DataError, match="curator's choice"):
        serve_estimates(back, np.ones(back.head_list.n_entries, dtype=np.int64), estimator="pooled")
    old = {k: v for k, v in e.items() if k not in ("s_corrected", "content_hash")}  # written before the correction
    old["content_hash"] = content_hash(old)
    assert release_from_documents(h, old).optin.kept is None  # pooled as released, blended as before


def test_a_release_written_before_the_estimator_field_reads_as_the_papers(log) -> None:
    """Files from before ``estimator`` existed (version 2, no ``params.estimator``) are the paper's
    estimates: they read as ``paper`` (LEGACY_ESTIMATOR), not as today's default ``reuse``."""
    from dataclasses import replace

    from hybriddp.core.params import DEFAULT_ESTIMATOR
    from hybriddp.core.protocol import content_hash

    assert DEFAULT_ESTIMATOR == "reuse" and BlenderParams().estimator == "reuse"
    rel, _ = curate(log, replace(PARAMS, estimator="paper"), seed=3)
    old = copy.deepcopy(rel.estimates)
    del old["params"]["estimator"]
    old["content_hash"] = content_hash(old)
    back = release_from_documents(rel.headlist, old)
    assert back.params.estimator == "paper" and back.optin.reused is None
    assert np.array_equal(back.optin.var_record, rel.optin.var_record)


def test_nan_never_reaches_a_document(release) -> None:
    d = copy.deepcopy(release.estimates)
    d["p_record"][0] = float("nan")
    with pytest.raises(DataError):
        release_from_documents(release.headlist, d)


def _records(release, n: int = 1) -> list[tuple[str, str | None]]:
    q = release.headlist["queries"][0]
    return [(q["query"], q["urls"][0] if q["urls"] else None)] * n


def test_server_counts_a_repeated_message_id_once(release) -> None:
    m1 = device_message(release.headlist, _records(release), source=SeededSource(1))
    m2 = device_message(release.headlist, _records(release), source=SeededSource(2))
    assert m1["id"] != m2["id"] and len(m1["id"]) == 22
    counts = count_messages(release, [m1, m2, dict(m1), m1])
    assert counts.messages == 2 and counts.reports == 2 and counts.duplicates == 2
    assert counts.counts.sum() == 2


def test_server_refuses_more_than_m_c_reports_and_bad_messages(release) -> None:
    m = device_message(release.headlist, _records(release), source=SeededSource(1))
    over = dict(m, id=new_message_id(), reports=m["reports"] * (release.m_c + 1))
    with pytest.raises(DataError, match="m_C"):
        count_messages(release, [over])
    for bad, needle in [(dict(m, id="short"), "message id"), ({k: v for k, v in m.items() if k != "id"}, "'id'"),
                        (dict(m, headlist="sha256:00"), "head list"), ([1, 2], "JSON object"),
                        (dict(m, reports=[{"query": "no such query", "url": None}]), "not in the head list"),
                        (dict(m, reports=[{"query": None, "url": "x"}]), "wildcard"),
                        (dict(m, reports=[{"query": 3, "url": None}]), "strings or null")]:
        with pytest.raises(HybridDPError, match=needle):
            count_messages(release, [bad])


def test_device_messages_have_fresh_os_ids(release) -> None:
    dhl = DeviceHeadList.from_json(release.headlist)
    ids = {device_message(dhl, _records(release))["id"] for _ in range(200)}
    assert len(ids) == 200


def test_ledger_charges_and_printed_guarantee_share_the_numbers(log) -> None:
    p = BlenderParams(epsilon=2.5, delta=1e-6, optin_fraction=0.1, head_list_size=20, m_c=2, f_c=0.7)
    run = run_blender(log, p, seed=2, with_charges=True)
    by_group = {c.group: c for c in round_charges(run)}
    assert (by_group["optin-S"].epsilon, by_group["optin-S"].delta) == (2.5, 1e-6)
    assert (by_group["optin-T"].epsilon, by_group["optin-T"].delta) == (2.5, 0.0)  # Theorem 2: pure ε
    assert (by_group["clients"].epsilon, by_group["clients"].delta) == (2.5, 1e-6)
    assert len(by_group["optin-S"].users) + len(by_group["optin-T"].users) == run.n_users_optin
    assert len(by_group["clients"].users) == run.n_users_clients
    res = run.result()
    mech = {m["group"]: m for m in res.guarantee()["mechanisms"]}
    for group, charge in by_group.items():
        assert (mech[group]["epsilon"], mech[group]["delta"]) == (charge.epsilon, charge.delta)
    assert run.release.charges and {c.group for c in run.release.charges} == {"optin-S", "optin-T"}
    text = describe(res.guarantees)
    assert text["clients"].startswith("(2.5, 1e-06)-local DP") and "m_C = 2" in text["clients"]


def test_reports_file_tells_complete_from_truncated(release, tmp_path) -> None:
    msgs = [device_message(release.headlist, _records(release), source=SeededSource(i)) for i in range(5)]
    path = tmp_path / "r.jsonl"
    assert write_reports(path, release.hash, msgs) == (5, 5)
    assert [m for _, m in read_messages(path)] == msgs
    lines = path.read_text().splitlines()
    for cut, needle in [(lines[:-1], "no end line"), (lines[:-2] + lines[-1:], "end line says"),
                        (lines[1:], "not a reports file"), (lines + lines[1:2], "after the end line")]:
        path.write_text("\n".join(cut) + "\n")
        with pytest.raises(DataError, match=needle):
            list(read_messages(path))
    gz = tmp_path / "r.jsonl.gz"
    write_reports(gz, release.hash, msgs)
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="truncated"):
        list(read_messages(gz))
    assert gzip.decompress(data).decode().count("\n") == 7


def test_refused_commit_leaves_earlier_reports_file(release, tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"earlier output\n")

    def refuse() -> None:
        raise HeadListError("the device ledger says no")

    msgs = [device_message(release.headlist, _records(release))]
    with pytest.raises(HeadListError):
        write_reports(path, release.hash, msgs, commit=refuse)
    assert path.read_bytes() == b"earlier output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]  # no temporary file left


# ----- seeded releases are marked non-private (PRIVACY.md "Randomness and seeds") --------------------------------

def _rehashed(doc: dict, **fields: object) -> dict:
    from hybriddp.core.protocol import content_hash

    out = {k: v for k, v in copy.deepcopy(doc).items() if k != "content_hash"}
    out.update(fields)
    out["content_hash"] = content_hash(out)
    return out


def test_a_seeded_release_is_marked_non_private_where_devices_and_ledgers_see_it(log, release) -> None:
    """Seeded: ``"non_private": true`` in the device head list (hash recomputed, devices accept it) and in the
    estimates, charges ``private=False``. Unseeded: the head list has no such key (its bytes are unchanged),
    the estimates say false and the charges are private."""
    h, e = release.headlist, release.estimates
    assert h["non_private"] is True and e["non_private"] is True and e["seed"] == 3 and release.non_private
    assert DeviceHeadList.from_json(copy.deepcopy(h)).doc["non_private"] is True  # the device's validator
    assert all(not c.private for c in release.charges) and {c.group for c in release.charges} == {"optin-S",
                                                                                                    "optin-T"}
    back = release_from_documents(copy.deepcopy(h), copy.deepcopy(e))
    assert back.non_private and back.headlist["non_private"] is True
    unseeded, _ = curate(log, PARAMS)
    assert "non_private" not in unseeded.headlist and unseeded.estimates["non_private"] is False
    assert not unseeded.non_private and all(c.private for c in unseeded.charges)
    # without the flag, the seeded head list is exactly what the writer makes of its lists (as before the flag)
    plain = {k: v for k, v in h.items() if k not in ("non_private", "content_hash")}
    assert _rehashed(plain) == release.head_list.to_device_json(
        release.queries, release.urls, epsilon=PARAMS.epsilon, delta=PARAMS.delta, f_c=release.f_c, m_c=release.m_c,
        url_level=release.url_level)
    assert set(unseeded.headlist) == set(plain) | {"content_hash"}
    assert not release_from_documents(unseeded.headlist, unseeded.estimates).non_private


def test_non_private_fields_are_validated(release) -> None:
    h, e = release.headlist, release.estimates
    for value in ("yes", 1, None):
        with pytest.raises(DataError, match="'non_private'"):
            release_from_documents(h, _rehashed(e, non_private=value))
    with pytest.raises(DataError, match=r"'non_private' = False .* true for a seeded release \(seed = 3\)"):
        release_from_documents(h, _rehashed(e, non_private=False))  # a seeded document cannot claim privacy
    false = _rehashed(h, non_private=False)
    with pytest.raises(HeadListError, match="'non_private' = False is not valid"):
        release_from_documents(false, _rehashed(e, headlist=false["content_hash"]))
    unmarked = _rehashed({k: v for k, v in h.items() if k != "non_private"})
    with pytest.raises(HeadListError, match="not marked non_private but its estimates say non_private = true"):
        release_from_documents(unmarked, _rehashed(e, headlist=unmarked["content_hash"]))
    # a publisher may withhold the seed: non_private stays true; a file written before the field reads as before
    assert release_from_documents(h, _rehashed(e, seed=None)).non_private
    older = _rehashed({k: v for k, v in e.items() if k != "non_private"}, headlist=unmarked["content_hash"])
    assert release_from_documents(unmarked, older).non_private  # its seed says so
