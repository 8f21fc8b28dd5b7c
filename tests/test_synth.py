"""Tests of the synthetic log generator and writers (hybriddp.datasets.synth, ALGORITHM.md §10).

Small scales only (≤ 1% of the users), no data files: every fixture is generated here.
"""

from __future__ import annotations

import gzip
import math
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybriddp.core.errors import ParameterError
from hybriddp.core.params import head_list_threshold
from hybriddp.core.records import NO_URL, RecordLog, SyntheticVocabulary, sample_records
from hybriddp.datasets import synth
from hybriddp.datasets.synth import PRESETS, RankLaw, generate, head_record_probabilities, write_log

AOL_HEADER = "AnonID\tQuery\tQueryTime\tItemRank\tClickURL"
SCALE = 0.005  # 2,597 AOL users, ~100k records


@pytest.fixture(scope="module")
def small_aol() -> RecordLog:
    return generate("aol", seed=11, scale=SCALE)


# --------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------


def test_unknown_preset_names_the_allowed_ones() -> None:
    with pytest.raises(ParameterError) as info:
        generate("bing", seed=1, scale=SCALE)
    message = str(info.value)
    assert "'bing'" in message and "'aol'" in message and "'yandex'" in message


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), 1e-9])
def test_bad_scale(scale: float) -> None:
    with pytest.raises(ParameterError, match="scale"):
        generate("aol", seed=1, scale=scale)


def test_seeded_determinism(small_aol: RecordLog) -> None:
    again = generate("aol", seed=11, scale=SCALE)
    assert np.array_equal(again.user_offsets, small_aol.user_offsets)
    assert np.array_equal(again.query, small_aol.query)
    assert np.array_equal(again.url, small_aol.url)
    other = generate("aol", seed=12, scale=SCALE)
    assert other.n_records != small_aol.n_records or not np.array_equal(other.query, small_aol.query)


def test_unseeded_runs_differ() -> None:
    a, b = generate("aol", scale=0.001), generate("aol", scale=0.001)
    assert a.n_records != b.n_records or not np.array_equal(a.query, b.query)


@pytest.mark.parametrize(("preset", "scale"), [("aol", SCALE), ("aol", 0.0123), ("yandex", 0.001)])
def test_user_count_and_grouping(preset: str, scale: float) -> None:
    log = small = generate(preset, seed=3, scale=scale)
    assert log.n_users == round(scale * PRESETS[preset].n_users)
    offsets = small.user_offsets
    assert offsets.dtype == np.int64 and offsets[0] == 0 and offsets[-1] == log.n_records
    assert (np.diff(offsets) >= 1).all()  # every user has a record, users in CSR order
    assert log.query.dtype == np.int32 and log.url.dtype == np.int32
    assert log.has_urls
    assert 0 <= log.query.min() and log.query.max() < len(log.queries)
    assert 0 <= log.url.min() and log.url.max() < len(log.urls)
    assert isinstance(log.queries, SyntheticVocabulary) and isinstance(log.urls, SyntheticVocabulary)


def test_progress_is_reported() -> None:
    calls: list[tuple[int, int]] = []
    generate("aol", seed=1, scale=0.001, progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1][0] == calls[-1][1]
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_records_per_user_heavy_tailed(small_aol: RecordLog) -> None:
    counts = small_aol.records_per_user()
    mean = PRESETS["aol"].mean_records
    # mean within 5 standard errors (lognormal σ = 1.6: sd ≈ 3.5 × mean)
    assert abs(counts.mean() - mean) < 5 * 3.5 * mean / math.sqrt(len(counts))
    assert np.median(counts) < 0.5 * mean  # many light users ...
    assert counts.max() > 10 * mean  # ... and a long tail of heavy ones


def test_top_query_is_google_with_paper_probability() -> None:
    log = generate("aol", seed=5, scale=0.01)  # 5,194 users
    n = log.n_users
    p_paper = 0.0213  # paper Figure 9
    sigma = math.sqrt(p_paper * (1 - p_paper) / n)  # binomial standard error of a 1-per-user sample
    google = int(log.queries.encode(["google"])[0])
    sample = sample_records(log, np.arange(n), 1, np.random.default_rng(0))
    p_sampled = np.bincount(sample.query, minlength=len(log.queries)) / len(sample)
    assert int(np.argmax(p_sampled)) == google
    assert abs(p_sampled[google] - p_paper) < 6 * sigma
    # the exact per-user-sampled probability (mean over users of the user's share) too
    counts = log.records_per_user()
    weight = np.repeat(1.0 / counts, counts) / n
    p_exact = np.bincount(log.query, weights=weight, minlength=len(log.queries))
    assert int(np.argmax(p_exact)) == google
    assert abs(p_exact[google] - p_paper) < 6 * sigma


def test_head_probabilities_follow_the_paper_and_decrease() -> None:
    pre = PRESETS["aol"]
    p = pre.head_probabilities
    assert p[: len(pre.named_queries)].tolist() == list(pre.named_probabilities)
    assert pre.named_queries[0] == "google" and p[0] == 0.0213
    assert (np.diff(p) <= 1e-15).all()  # ranks are ranks
    assert p[len(pre.named_queries)] < min(pre.named_probabilities)  # rank 10 below ebay
    assert 0 < p.sum() < 1
    for name in PRESETS:
        assert 0 < PRESETS[name].head_probabilities.sum() < 1


def test_aol_top50_records_mass_matches_figure_9() -> None:
    _, _, p = head_record_probabilities("aol")
    outside = 1 - np.sort(p)[::-1][:50].sum()
    assert abs(outside - 0.9108) < 0.002


def test_yandex_head_supports_m500_from_small_optin() -> None:
    _, _, p = head_record_probabilities("yandex")
    ps = np.sort(p)[::-1]
    # at 1.5% opt-in S holds ~70.8k sampled records and τ(ε=4, δ=1e-7) ≈ 9.06: the 500th record
    # must be expected ~10+ times, while at ε = 1 (τ ≈ 33) a 500-record list must not form (§5)
    n_s = 0.95 * 0.015 * 4_970_073
    assert ps[499] * n_s > 10
    assert ps[499] * n_s < head_list_threshold(1.0, 1e-7, 1)


def test_head_urls_are_skewed_distributions() -> None:
    for name in PRESETS:
        query, _, p = head_record_probabilities(name)
        pre = PRESETS[name]
        totals = np.bincount(query, weights=p, minlength=pre.head_size)
        assert np.allclose(totals, pre.head_probabilities)
        n_urls = np.bincount(query, minlength=pre.head_size)
        assert n_urls.min() >= 1 and n_urls.max() >= 10  # a few to dozens
        first = np.concatenate([[0], np.cumsum(n_urls)[:-1]])
        dominant = p[first] / pre.head_probabilities
        multi = n_urls > 1
        assert (dominant[multi] < 1).all() and np.median(dominant[multi]) > 0.5
        # within a query the URLs are not all equally likely
        assert (p[first[multi]] > p[first[multi] + 1]).mean() > 0.9


def test_google_urls_in_the_log(small_aol: RecordLog) -> None:
    google = small_aol.query == 0
    urls, counts = np.unique(small_aol.url[google], return_counts=True)
    assert small_aol.urls.decode([urls[np.argmax(counts)]]) == ["http://www.google.com"]
    assert len(urls) >= 3 and counts.max() / counts.sum() > 0.75


def test_distinct_counts_scale_with_users() -> None:
    scale = 0.01
    log = generate("aol", seed=2, scale=scale)
    pre = PRESETS["aol"]
    n_q = np.count_nonzero(np.bincount(log.query))
    n_u = np.count_nonzero(np.bincount(log.url))
    assert abs(n_q / (scale * pre.distinct_queries) - 1) < 0.05
    assert abs(n_u / (scale * pre.distinct_urls) - 1) < 0.05
    assert n_u < n_q  # URLs are shared across queries


def test_rank_law_inverse_and_mass() -> None:
    law = RankLaw(0.01, 1.0, (10.0, 500.0), (0.8, 1.0, 1.5))
    r = np.array([1.0, 2.5, 9.99, 10.0, 77.0, 500.0, 1e4])
    assert np.allclose(law.inverse(law.cumulative(r)), r, rtol=1e-9)
    # continuity at the breaks and the mass as the integral of the density
    assert np.allclose(law.density(np.array([10.0 - 1e-9, 500.0 - 1e-9])),
                       law.density(np.array([10.0, 500.0])), rtol=1e-6)
    grid = np.linspace(1.0, 800.0, 400_001)
    numeric = np.trapezoid(law.density(grid), grid)
    assert math.isclose(float(law.cumulative(800.0)), numeric, rel_tol=1e-5)


# --------------------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------------------


def test_parquet_writer(tmp_path, small_aol: RecordLog) -> None:
    path = tmp_path / "log.parquet"
    write_log(small_aol, path)
    table = pq.read_table(path)
    assert table.schema.names == ["user", "query", "url"]
    assert table.schema.types == [pa.int64(), pa.string(), pa.string()]
    assert table.num_rows == small_aol.n_records
    users = table.column("user").to_numpy()
    assert np.array_equal(np.bincount(users), small_aol.records_per_user())
    head = slice(0, 2000)
    assert table.column("query").to_pylist()[head] == small_aol.queries.decode(small_aol.query[head])
    assert table.column("url").to_pylist()[head] == small_aol.urls.decode(small_aol.url[head])


def test_parquet_writer_without_urls(tmp_path) -> None:
    vocab = SyntheticVocabulary(5, "item ", ["a", "b"])
    log = RecordLog(np.array([0, 2, 5]), np.array([0, 3, 1, 4, 2], dtype=np.int32),
                    np.full(5, NO_URL, dtype=np.int32), vocab, vocab, has_urls=False)
    path = tmp_path / "items.parquet"
    write_log(log, path, format="parquet")
    table = pq.read_table(path)
    assert table.column("user").to_pylist() == [0, 0, 1, 1, 1]
    assert table.column("query").to_pylist() == ["a", "item 3", "b", "item 4", "item 2"]
    assert table.column("url").null_count == 5
    with pytest.raises(ParameterError, match="format"):
        write_log(log, tmp_path / "items.tsv", format="aol")


def test_unknown_write_format(tmp_path, small_aol: RecordLog) -> None:
    with pytest.raises(ParameterError, match="'parquet', 'aol'"):
        write_log(small_aol, tmp_path / "x.csv", format="csv")


def _read_aol_lines(path) -> list[list[str]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        text = f.read()
    assert text.endswith("\n") and "\r" not in text
    return [line.split("\t") for line in text[:-1].split("\n")]


@pytest.mark.parametrize("name", ["log.tsv", "log.txt.gz"])
def test_aol_writer_format(tmp_path, small_aol: RecordLog, name: str) -> None:
    path = tmp_path / name
    calls: list[int] = []
    write_log(small_aol, path, format="aol", seed=4, progress=lambda d, t: calls.append(d))
    assert calls[-1] == small_aol.n_records
    rows = _read_aol_lines(path)
    assert "\t".join(rows[0]) == AOL_HEADER
    rows = rows[1:]
    assert all(len(r) == 5 for r in rows)
    click = [r for r in rows if r[4] != ""]
    no_click = [r for r in rows if r[4] == ""]
    assert len(click) == small_aol.n_records
    assert all(r[3] == "" for r in no_click)
    assert {int(r[3]) for r in click} <= set(range(1, 11))
    share = len(no_click) / len(rows)  # AOL: 16,946,938 of 36,389,567 lines (46.6%)
    assert 0.42 < share < 0.51
    # users in order, all of them, with their click records in order
    anon = np.array([int(r[0]) for r in rows])
    assert (np.diff(anon) >= 0).all()
    assert np.array_equal(np.bincount([int(r[0]) for r in click]), small_aol.records_per_user())
    assert [r[1] for r in click[:500]] == small_aol.queries.decode(small_aol.query[:500])
    assert [r[4] for r in click[:500]] == small_aol.urls.decode(small_aol.url[:500])
    # increasing times per user within March-May 2006
    times = np.array([datetime.strptime(r[2], "%Y-%m-%d %H:%M:%S").timestamp() for r in rows])
    same_user = anon[1:] == anon[:-1]
    assert (np.diff(times)[same_user] > 0).all()
    assert min(r[2] for r in rows) >= "2006-03-01 00:00:00"
    assert max(r[2] for r in rows) <= "2006-05-31 23:59:59"


def test_aol_writer_is_seeded(tmp_path) -> None:
    log = generate("aol", seed=1, scale=0.001)
    a, b, c = tmp_path / "a.tsv", tmp_path / "b.tsv", tmp_path / "c.tsv"
    write_log(log, a, format="aol", seed=9)
    write_log(log, b, format="aol", seed=9)
    write_log(log, c, format="aol", seed=10)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def _loaders():
    """The project's loaders (the synthetic logs must load through them)."""
    import hybriddp.io.loaders as loaders
    return loaders


def _same_log(a: RecordLog, b: RecordLog) -> bool:
    return (np.array_equal(a.user_offsets, b.user_offsets)
            and a.queries.decode(a.query) == b.queries.decode(b.query)
            and a.urls.decode(a.url) == b.urls.decode(b.url))


@pytest.mark.parametrize("name", ["log.tsv", "log.tsv.gz"])
def test_round_trip_through_load_aol(tmp_path, small_aol: RecordLog, name: str) -> None:
    loaders = _loaders()
    path = tmp_path / name
    write_log(small_aol, path, format="aol", seed=2)
    loaded = loaders.load_aol(path)
    assert _same_log(loaded, small_aol)
    assert loaded.stats.rows_without_click > 0


def test_round_trip_through_load_table(tmp_path, small_aol: RecordLog) -> None:
    loaders = _loaders()
    path = tmp_path / "log.parquet"
    write_log(small_aol, path)
    loaded = loaders.load_table(path, user_col="user", query_col="query", url_col="url")
    assert _same_log(loaded, small_aol)


def test_writer_decodes_loaded_vocabularies(tmp_path, small_aol: RecordLog) -> None:
    """A log with ArrayVocabulary strings (as loaders make) is written as is."""
    from hybriddp.core.records import ArrayVocabulary

    queries = ArrayVocabulary(["weather", "news\u00e9", 'say "hi"'])
    urls = ArrayVocabulary(["http://a.com", "http://b.com"])
    log = RecordLog(np.array([0, 1, 3]), np.array([2, 0, 1], dtype=np.int32),
                    np.array([1, 0, 1], dtype=np.int32), queries, urls)
    path = tmp_path / "small.tsv"
    write_log(log, path, format="aol", seed=0)
    click = [r for r in _read_aol_lines(path)[1:] if r[4]]
    assert [(r[0], r[1], r[4]) for r in click] == [
        ("0", 'say "hi"', "http://b.com"), ("1", "weather", "http://a.com"), ("1", "news\u00e9", "http://b.com")]


def test_synthetic_names_vectorized() -> None:
    assert synth.synthetic_names("q", np.array([0, 12, 345])).to_pylist() == ["q0", "q12", "q345"]


def test_aol_writer_refuses_a_tab_in_a_query(tmp_path) -> None:
    from hybriddp.core.errors import DataError
    from hybriddp.core.records import ArrayVocabulary

    log = RecordLog(np.array([0, 1]), np.array([0], dtype=np.int32), np.array([0], dtype=np.int32),
                    ArrayVocabulary(["a\tb"]), ArrayVocabulary(["http://a.com"]))
    with pytest.raises(DataError, match="tab or line break"):
        write_log(log, tmp_path / "bad.tsv", format="aol", seed=0)
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no temporary file left


# --------------------------------------------------------------------------------------
# Atomic output (io.atomic) and output-path checks
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "fmt"), [("log.tsv.gz", "aol"), ("log.parquet", "parquet")])
def test_interrupted_write_keeps_the_earlier_file(tmp_path, small_aol: RecordLog, name: str, fmt: str) -> None:
    """Interrupted after the records are written but before the file is finished (the gzip trailer,
    the Parquet footer): the earlier file is untouched and no temporary file is left."""
    path = tmp_path / name
    path.write_bytes(b"the earlier file\n")

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_log(small_aol, path, format=fmt, seed=1, progress=interrupt)
    assert path.read_bytes() == b"the earlier file\n"
    assert list(tmp_path.iterdir()) == [path]
    write_log(small_aol, path, format=fmt, seed=1)  # an uninterrupted write replaces it whole
    if fmt == "parquet":
        assert pq.read_table(path).num_rows == small_aol.n_records
    else:
        assert sum(r[4] != "" for r in _read_aol_lines(path)[1:]) == small_aol.n_records
    assert list(tmp_path.iterdir()) == [path]


def test_write_log_refuses_an_unwritable_path(tmp_path, small_aol: RecordLog) -> None:
    from hybriddp.core.errors import DataError

    with pytest.raises(DataError, match="does not exist") as info:
        write_log(small_aol, tmp_path / "no" / "such" / "log.parquet")
    assert str(tmp_path / "no" / "such") in str(info.value)
    with pytest.raises(DataError, match="is a directory"):
        write_log(small_aol, tmp_path, format="parquet")


def test_cli_checks_the_output_before_generating(tmp_path, monkeypatch) -> None:
    from clihelpers import assert_clean_error, invoke

    def no_generation(*args: object, **kwargs: object) -> None:
        raise AssertionError("generated before the output path was checked")

    monkeypatch.setattr(synth, "generate", no_generation)
    missing = tmp_path / "missing" / "log.tsv.gz"
    assert_clean_error(invoke("synth", "--scale", "0.001", "-o", missing, ok=False), "--output", str(missing),
                       "does not exist")
    assert_clean_error(invoke("synth", "--scale", "0.001", "-o", tmp_path, ok=False), "--output", "directory")


def test_cli_replaces_an_existing_file_whole(tmp_path) -> None:
    from clihelpers import invoke

    path = tmp_path / "log.parquet"
    path.write_bytes(b"an earlier file")
    invoke("synth", "--scale", "0.001", "--seed", "3", "-o", path)
    log = generate("aol", seed=3, scale=0.001)
    assert pq.read_table(path).num_rows == log.n_records
    assert list(tmp_path.iterdir()) == [path]
