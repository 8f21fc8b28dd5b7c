"""Property-based fuzzing of what the server reads: the opt-in estimates document, device
messages, and reports files. Only the project's error class (HybridDPError) may escape."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybriddp.core.errors import HybridDPError
from hybriddp.core.params import BlenderParams
from hybriddp.core.protocol import content_hash
from hybriddp.curator.party import curate
from hybriddp.curator.release import release_from_documents
from hybriddp.io.exchange import read_messages
from hybriddp.server.party import count_messages
from logdata import zipf_log

FUZZ = settings(max_examples=150, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@pytest.fixture(scope="module")
def release():
    rel, _ = curate(zipf_log(n_users=4_000, n_queries=50, seed=9), BlenderParams(optin_fraction=0.2,
                                                                                 head_list_size=10), seed=1)
    return rel


def _only_project_errors(fn, *args) -> None:
    try:
        fn(*args)
    except HybridDPError:
        pass


@FUZZ
@given(doc=json_values)
def test_estimates_reader_on_arbitrary_json(release, doc) -> None:
    _only_project_errors(release_from_documents, release.headlist, doc)


@FUZZ
@given(field=st.sampled_from(["n", "noise_variance", "p_record", "draws_record", "p_query", "draws_query", "params",
                              "noise", "seed", "sizes", "headlist", "format", "version"]),
       value=json_values, rehash=st.booleans())
def test_estimates_reader_on_mutated_documents(release, field, value, rehash) -> None:
    doc = copy.deepcopy(release.estimates)
    doc[field] = value
    if rehash:
        doc["content_hash"] = content_hash(doc)
    _only_project_errors(release_from_documents, release.headlist, doc)


@FUZZ
@given(msgs=st.lists(json_values, max_size=4))
def test_message_counter_on_arbitrary_json(release, msgs) -> None:
    _only_project_errors(count_messages, release, msgs)


@FUZZ
@given(reports=st.lists(st.fixed_dictionaries({"query": st.none() | st.text(max_size=6) | st.integers(),
                                               "url": st.none() | st.text(max_size=6) | json_values}), max_size=3),
       mid=st.text(max_size=24) | json_values)
def test_message_counter_on_mutated_messages(release, reports, mid) -> None:
    msg = {"id": mid, "headlist": release.hash, "reports": reports}
    _only_project_errors(count_messages, release, [msg])


@FUZZ
@given(data=st.binary(max_size=300), gz=st.booleans())
def test_reports_file_reader_on_arbitrary_bytes(tmp_path_factory, release, data, gz) -> None:
    path = tmp_path_factory.mktemp("r") / ("r.jsonl.gz" if gz else "r.jsonl")
    if gz:
        import gzip
        data = gzip.compress(data)[: max(1, len(data))]
    path.write_bytes(data)
    _only_project_errors(lambda: count_messages(release, (m for _, m in read_messages(path))))


@FUZZ
@given(lines=st.lists(json_values.map(lambda v: json.dumps(v)), max_size=4))
def test_reports_file_reader_on_json_lines(tmp_path_factory, release, lines) -> None:
    header = json.dumps({"format": "hybriddp-reports", "version": 2, "headlist": release.hash})
    path = tmp_path_factory.mktemp("r") / "r.jsonl"
    path.write_text("\n".join([header, *lines]) + "\n")
    _only_project_errors(lambda: count_messages(release, (m for _, m in read_messages(path))))
