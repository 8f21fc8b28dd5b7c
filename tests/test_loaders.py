"""Tests of the log readers (hybriddp.io.loaders and its per-format modules aol, tables, items): AOL,
CSV/TSV/Parquet tables, item logs, format detection."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybriddp.core.errors import DataError, ParameterError
from hybriddp.core.records import NO_URL, RecordLog
from hybriddp.io import blocks
from hybriddp.io import items as item_logs
from hybriddp.io.loaders import AOL_HEADER, detect_format, load_aol, load_items, load_log, load_table
from hybriddp.io.textfiles import table_format
from hybriddp.io.values import read_value_column

# (AnonID, Query, QueryTime, ItemRank, ClickURL)
AOL_ROWS = [
    ("479", "family guy", "2006-03-01 16:01:20", "", ""),
    ("479", "family guy movie references", "2006-03-03 22:37:46", "1", "http://www.familyguyfiles.com"),
    ("479", '"top grossing" movies', "2006-03-03 22:42:42", "1", "http://movieweb.com"),
    ("507", "kbb.com", "2006-03-01 16:45:19", "1", "http://www.kbb.com"),
    ("507", "family guy", "2006-03-02 14:48:55", "3", "http://www.familyguyfiles.com"),
    ("217", "café crème ☕", "2006-03-04 09:00:00", "2", "http://ex.com/ü"),
    ("217", "say \"hi\" 'there'", "2006-03-04 09:01:00", "", ""),
    ("479", "family guy", "2006-03-05 10:00:00", "2", "http://www.familyguyfiles.com"),
    ("999", "no clicks here", "2006-03-05 11:00:00", "", ""),
]
CLICKS = [r for r in AOL_ROWS if r[4]]


def write_aol(path: Path, rows=AOL_ROWS, header: str = AOL_HEADER, compress: bool = False,
              extra_lines: dict[int, str] | None = None) -> Path:
    """Write rows as an AOL file; ``extra_lines[i]`` is inserted before data row ``i``."""
    lines = [header]
    for i, r in enumerate(rows):
        if extra_lines and i in extra_lines:
            lines.append(extra_lines[i])
        lines.append("\t".join(r))
    text = ("\n".join(lines) + "\n").encode("utf-8")
    if compress:
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)
    return path


def records_by_user(log: RecordLog) -> dict[tuple[str, ...], Counter]:
    """Multiset of (query, url) of each user, keyed by the user's sorted records (user ids differ)."""
    out = []
    for i in range(log.n_users):
        a, b = log.user_offsets[i], log.user_offsets[i + 1]
        qs = log.queries.decode(log.query[a:b])
        us = log.urls.decode(log.url[a:b]) if log.has_urls else [None] * (b - a)
        out.append(Counter(zip(qs, us, strict=True)))
    return out


def expected_by_user(rows, user_of, query_of, url_of) -> list[Counter]:
    groups: dict[object, Counter] = {}
    for r in rows:
        groups.setdefault(user_of(r), Counter())[(query_of(r), url_of(r))] += 1
    return list(groups.values())


def same_groups(a: list[Counter], b: list[Counter]) -> bool:
    key = lambda c: sorted(c.items())  # noqa: E731
    return sorted(map(key, a)) == sorted(map(key, b))


def assert_valid(log: RecordLog) -> None:
    assert log.query.dtype == np.int32 and log.url.dtype == np.int32
    assert log.user_offsets[0] == 0 and log.user_offsets[-1] == log.n_records
    assert np.all(np.diff(log.user_offsets) > 0)
    assert log.query.min(initial=0) >= 0 and log.query.max(initial=-1) < len(log.queries)
    assert len(set(log.queries.strings.tolist())) == len(log.queries)
    if log.has_urls:
        assert log.url.max(initial=-1) < len(log.urls)
        assert len(set(log.urls.strings.tolist())) == len(log.urls)
    else:
        assert np.all(log.url == NO_URL)


# --------------------------------------------------------------------------------------
# AOL
# --------------------------------------------------------------------------------------


def test_aol_round_trip(tmp_path: Path) -> None:
    log = load_aol(write_aol(tmp_path / "a.txt"))
    assert_valid(log)
    assert log.has_urls
    assert log.n_records == len(CLICKS) == 6
    assert log.n_users == 3  # user 999 has no click
    assert log.stats.rows_read == len(AOL_ROWS)
    assert log.stats.rows_without_click == 3
    assert log.stats.rows_skipped_bad == 0
    # users in increasing AnonID order: 217, 479, 507
    assert log.records_per_user().tolist() == [1, 3, 2]
    assert sorted(log.queries.strings.tolist()) == sorted({r[1] for r in CLICKS})
    assert sorted(log.urls.strings.tolist()) == sorted({r[4] for r in CLICKS})
    got = records_by_user(log)
    want = expected_by_user(CLICKS, lambda r: r[0], lambda r: r[1], lambda r: r[4])
    assert same_groups(got, want)
    # users 479 (index 1) and 507 (index 2) both clicked ("family guy", familyguyfiles): same ids
    fg = log.queries.encode(["family guy"])[0]
    fgf = log.urls.encode(["http://www.familyguyfiles.com"])[0]
    for user in (1, 2):
        a, b = log.user_offsets[user], log.user_offsets[user + 1]
        assert np.sum((log.query[a:b] == fg) & (log.url[a:b] == fgf)) == 1


def test_aol_quotes_and_unicode(tmp_path: Path) -> None:
    log = load_aol(write_aol(tmp_path / "a.tsv"))
    qs = set(log.queries.strings.tolist())
    assert '"top grossing" movies' in qs
    assert "café crème ☕" in qs
    assert "http://ex.com/ü" in set(log.urls.strings.tolist())
    ids = log.queries.encode(['"top grossing" movies'])
    assert ids[0] >= 0 and log.queries.decode(ids) == ['"top grossing" movies']


def test_aol_keep_no_click(tmp_path: Path) -> None:
    log = load_aol(write_aol(tmp_path / "a.txt"), keep_no_click=True)
    assert_valid(log)
    assert log.n_records == len(AOL_ROWS)
    assert log.n_users == 4
    assert log.stats.rows_without_click == 3
    assert "" in set(log.urls.strings.tolist())
    pairs = Counter(zip(log.queries.decode(log.query), log.urls.decode(log.url), strict=True))
    assert pairs[("no clicks here", "")] == 1
    assert pairs[("family guy", "")] == 1


def test_aol_gz_equals_plain(tmp_path: Path) -> None:
    plain = load_aol(write_aol(tmp_path / "a.txt"))
    gz = load_aol(write_aol(tmp_path / "a.txt.gz", compress=True))
    assert np.array_equal(plain.user_offsets, gz.user_offsets)
    assert plain.queries.decode(plain.query) == gz.queries.decode(gz.query)
    assert plain.urls.decode(plain.url) == gz.urls.decode(gz.url)
    assert plain.stats == gz.stats


def test_aol_many_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small blocks: codes are unified across blocks and line numbers stay right."""
    monkeypatch.setattr(blocks, "BLOCK_SIZE", 256)
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(400):
        u, q, c = rng.integers(0, 30), rng.integers(0, 50), rng.random() < 0.6
        rows.append((str(u), f"q{q}", "t", "1" if c else "", f"http://u{q % 7}" if c else ""))
    path = write_aol(tmp_path / "a.txt", rows)
    log = load_aol(path)
    assert_valid(log)
    clicks = [r for r in rows if r[4]]
    assert log.n_records == len(clicks)
    assert log.stats.rows_without_click == len(rows) - len(clicks)
    assert same_groups(records_by_user(log),
                       expected_by_user(clicks, lambda r: r[0], lambda r: r[1], lambda r: r[4]))
    bad = list(rows)
    bad[300] = ("x7", "q", "t", "1", "http://u")
    with pytest.raises(DataError, match=r"line 302: AnonID 'x7' is not an integer"):
        load_aol(write_aol(tmp_path / "b.txt", bad))


def test_aol_bad_field_count_line_number(tmp_path: Path) -> None:
    path = write_aol(tmp_path / "bad.txt", extra_lines={4: "507\tonly three\tfields"})
    with pytest.raises(DataError) as ei:
        load_aol(path)
    msg = str(ei.value)
    assert "bad.txt" in msg
    assert "line 6:" in msg  # header, 4 rows, then the bad line
    assert "expected 5 tab-separated fields, found 3" in msg
    assert "--skip-bad-rows" in msg


def test_aol_bad_anon_and_rank(tmp_path: Path) -> None:
    rows = list(AOL_ROWS)
    rows[2] = ("47x", *rows[2][1:])
    with pytest.raises(DataError, match=r"bad\.txt: line 4: AnonID '47x' is not an integer"):
        load_aol(write_aol(tmp_path / "bad.txt", rows))
    rows = list(AOL_ROWS)
    rows[3] = ("507", "kbb.com", "t", "first", "http://www.kbb.com")
    with pytest.raises(DataError, match=r"line 5: ItemRank 'first' of a row with a click is not an integer"):
        load_aol(write_aol(tmp_path / "bad2.txt", rows))


def test_aol_earliest_bad_line_reported(tmp_path: Path) -> None:
    rows = list(AOL_ROWS)
    rows[6] = ("x", *rows[6][1:])  # bad AnonID on line 2 + 6 + 1 (the extra line) = 9
    path = write_aol(tmp_path / "bad.txt", rows, extra_lines={1: "1\t2"})
    with pytest.raises(DataError, match=r"line 3: expected 5"):
        load_aol(path)


def test_aol_skip_bad_rows(tmp_path: Path) -> None:
    rows = list(AOL_ROWS)
    rows[1] = ("abc", *rows[1][1:])  # line 3 (after the extra line 3 it becomes line 4)
    extra = {0: "1\t2\t3", 5: "a\tb\tc\td\te\tf"}
    path = write_aol(tmp_path / "bad.txt", rows, extra_lines=extra)
    log = load_aol(path, skip_bad_rows=True)
    assert_valid(log)
    assert log.stats.rows_skipped_bad == 3
    assert log.stats.rows_read == len(rows) + 2
    assert log.n_records == len(CLICKS) - 1
    assert log.stats.bad_row_examples == [
        "line 2: expected 5 tab-separated fields, found 3",
        "line 4: AnonID 'abc' is not an integer",
        "line 8: expected 5 tab-separated fields, found 6",
    ]


def test_aol_blank_lines_ignored(tmp_path: Path) -> None:
    rows = list(AOL_ROWS)
    rows[5] = ("x", *rows[5][1:])
    path = write_aol(tmp_path / "a.txt", rows, extra_lines={2: "", 3: ""})
    with pytest.raises(DataError, match="line 9:"):  # blank lines still count as lines
        load_aol(path)
    log = load_aol(write_aol(tmp_path / "b.txt", extra_lines={2: "", 3: ""}))
    assert log.n_records == len(CLICKS)
    assert log.stats.rows_read == len(AOL_ROWS)


def test_aol_crlf_and_bad_utf8(tmp_path: Path) -> None:
    text = (AOL_HEADER + "\r\n1\tq\\xff q\tt\t1\thttp://a\r\n2\tok\tt\t1\thttp://b\r\n").encode()
    text = text.replace(b"\\xff", b"\xff")
    path = tmp_path / "a.txt"
    path.write_bytes(text)
    log = load_aol(path)
    assert log.n_records == 2
    assert sorted(log.queries.strings.tolist()) == ["ok", "q\ufffd q"]
    assert sorted(log.urls.strings.tolist()) == ["http://a", "http://b"]


def test_aol_wrong_header(tmp_path: Path) -> None:
    path = write_aol(tmp_path / "a.txt", header="user\tquery\ttime\trank\turl")
    with pytest.raises(DataError, match="not the AOL header") as ei:
        load_aol(path)
    assert "AnonID Query QueryTime ItemRank ClickURL" in str(ei.value)


def test_aol_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(DataError, match=f"file not found: {missing}"):
        load_aol(missing)


def test_aol_progress(tmp_path: Path) -> None:
    path = write_aol(tmp_path / "a.txt")
    calls: list[tuple[int, int]] = []
    load_aol(path, progress=lambda done, total: calls.append((done, total)))
    size = path.stat().st_size
    assert calls and calls[-1] == (size, size)
    assert all(t == size and 0 <= d <= size for d, t in calls)


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------

TABLE = {
    "uid": ["u1", "u2", "u1", "u3", "u2", "u1", "u4"],
    "q": ["apple", 'say "hi"', "pear, ripe", "apple", "plum", "apple", "fig"],
    "link": ["http://a", "http://b", "", "http://a", "http://c", "http://a", ""],
    "other": ["x", "y", "z", "w", "v", "u", "t"],
}


def write_csv(path: Path, table=TABLE, sep: str = ",", compress: bool = False) -> Path:
    import csv
    import io

    buf = io.StringIO()
    names = list(table)
    if sep == ",":
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(names)
        w.writerows(zip(*(table[n] for n in names), strict=True))
    else:
        buf.write("\t".join(names) + "\n")
        for row in zip(*(table[n] for n in names), strict=True):
            buf.write("\t".join(row) + "\n")
    data = buf.getvalue().encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def write_parquet(path: Path, table=TABLE) -> Path:
    pq.write_table(pa.table(table), path)
    return path


def table_expected(table=TABLE, with_url: bool = True, per_row: bool = False) -> list[Counter]:
    rows = list(zip(table["uid"], table["q"], table["link"], strict=True))
    if with_url:
        rows = [r for r in rows if r[2]]
    idx = {id(r): i for i, r in enumerate(rows)}
    return expected_by_user(rows, (lambda r: idx[id(r)]) if per_row else (lambda r: r[0]),
                            lambda r: r[1], (lambda r: r[2]) if with_url else (lambda r: None))


@pytest.mark.parametrize("kind", ["csv", "tsv", "csv.gz", "tsv.gz", "parquet"])
def test_table_user_query_url(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"t.{kind}"
    if kind == "parquet":
        write_parquet(path)
    else:
        write_csv(path, sep="," if kind.startswith("csv") else "\t", compress=kind.endswith(".gz"))
    log = load_table(path, user_col="uid", query_col="q", url_col="link")
    assert_valid(log)
    assert log.has_urls
    assert log.n_records == 5 and log.n_users == 3
    assert log.stats.rows_read == 7
    assert log.stats.rows_without_click == 2
    assert same_groups(records_by_user(log), table_expected())
    assert 'say "hi"' in set(log.queries.strings.tolist())
    assert "pear, ripe" not in set(log.queries.strings.tolist())  # no click


def test_table_no_url_and_row_per_user(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv")
    log = load_table(path, user_col="uid", query_col="q")
    assert_valid(log)
    assert not log.has_urls
    assert log.n_records == 7 and log.n_users == 4
    assert "pear, ripe" in set(log.queries.strings.tolist())
    assert same_groups(records_by_user(log), table_expected(with_url=False))
    per = load_table(path, query_col="q", row_per_user=True)
    assert per.n_users == 7 and per.records_per_user().tolist() == [1] * 7
    assert per.queries.decode(per.query) == TABLE["q"]  # row order is kept
    per_url = load_table(path, query_col="q", url_col="link", row_per_user=True)
    assert per_url.n_users == 5


def test_table_int_users_parquet(tmp_path: Path) -> None:
    table = {"user": [10, 3, 10, 7], "query": ["a", "b", "c", "a"]}
    log = load_table(write_parquet(tmp_path / "t.parquet", table), user_col="user")
    assert log.n_users == 3 and sorted(log.records_per_user().tolist()) == [1, 1, 2]
    assert same_groups(records_by_user(log),
                       expected_by_user(list(zip(table["user"], table["query"], strict=True)),
                                        lambda r: r[0], lambda r: r[1], lambda r: None))


def test_table_missing_column(tmp_path: Path) -> None:
    for path in (write_csv(tmp_path / "t.csv"), write_parquet(tmp_path / "t.parquet")):
        with pytest.raises(DataError) as ei:
            load_table(path, user_col="user", query_col="q")
        msg = str(ei.value)
        assert "'user'" in msg and path.name in msg
        assert "'uid', 'q', 'link', 'other'" in msg
        assert "--user-col" in msg


def test_table_user_col_required(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv")
    with pytest.raises(ParameterError, match="--row-per-user"):
        load_table(path, query_col="q")
    with pytest.raises(ParameterError):
        load_table(path, user_col="uid", query_col="q", row_per_user=True)


def test_table_empty_query_is_bad(tmp_path: Path) -> None:
    table = {k: list(v) for k, v in TABLE.items()}
    table["q"][3] = ""
    path = write_csv(tmp_path / "t.csv", table)
    with pytest.raises(DataError, match=r"t\.csv: line 5: empty query in column 'q'.*--skip-bad-rows"):
        load_table(path, user_col="uid", query_col="q", url_col="link")
    log = load_table(path, user_col="uid", query_col="q", url_col="link", skip_bad_rows=True)
    assert log.stats.rows_skipped_bad == 1 and log.n_records == 4
    assert log.stats.bad_row_examples == ["line 5: empty query in column 'q'"]
    pq_path = write_parquet(tmp_path / "t.parquet", table)
    with pytest.raises(DataError, match=r"row 4: empty query"):
        load_table(pq_path, user_col="uid", query_col="q")
    assert load_table(pq_path, user_col="uid", query_col="q", skip_bad_rows=True).n_records == 6


def test_table_unknown_format(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.data")
    with pytest.raises(DataError, match="pass --format"):
        load_table(path, user_col="uid", query_col="q")
    assert load_table(path, user_col="uid", query_col="q", format="csv").n_records == 7


# --------------------------------------------------------------------------------------
# Items
# --------------------------------------------------------------------------------------

ITEMS_TEXT = "1 2 3\n1\n\n4 5  6 7\n 3\t2 \n2 2\n"


@pytest.mark.parametrize("compress", [False, True])
def test_items(tmp_path: Path, compress: bool) -> None:
    data = ITEMS_TEXT.encode()
    path = tmp_path / ("k.dat.gz" if compress else "k.dat")
    path.write_bytes(gzip.compress(data) if compress else data)
    log = load_items(path)
    assert_valid(log)
    assert not log.has_urls
    assert log.stats.rows_read == 6
    assert log.stats.rows_without_click == 1  # the empty line
    assert log.n_users == 5 and log.n_records == 12
    assert log.records_per_user().tolist() == [3, 1, 4, 2, 2]
    assert log.queries.decode(log.query) == "1 2 3 1 4 5 6 7 3 2 2 2".split()
    assert sorted(log.queries.strings.tolist()) == ["1", "2", "3", "4", "5", "6", "7"]


def test_items_chunks_and_no_final_newline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(item_logs, "_ITEMS_CHUNK", 7)
    rng = np.random.default_rng(3)
    lines = [" ".join(str(x) for x in rng.integers(0, 40, rng.integers(0, 6))) for _ in range(200)]
    path = tmp_path / "k.dat"
    path.write_text("\n".join(lines))  # no newline at the end
    log = load_items(path)
    assert log.stats.rows_read == 200
    assert log.stats.rows_without_click == sum(1 for ln in lines if not ln)
    assert log.records_per_user().tolist() == [len(ln.split()) for ln in lines if ln]
    assert log.queries.decode(log.query) == " ".join(lines).split()


# --------------------------------------------------------------------------------------
# load_log
# --------------------------------------------------------------------------------------


def test_detect_format(tmp_path: Path) -> None:
    assert detect_format(write_aol(tmp_path / "a.txt")) == "aol"
    assert detect_format(write_aol(tmp_path / "a.tsv.gz", compress=True)) == "aol"
    assert detect_format(write_aol(tmp_path / "a.log")) == "aol"
    assert detect_format(write_csv(tmp_path / "t.tsv", sep="\t")) == "tsv"
    assert detect_format(write_csv(tmp_path / "t.txt.gz", sep="\t", compress=True)) == "tsv"
    assert detect_format(write_csv(tmp_path / "t.csv.gz", compress=True)) == "csv"
    assert detect_format(write_parquet(tmp_path / "t.parquet")) == "parquet"
    (tmp_path / "k.dat").write_text(ITEMS_TEXT)
    assert detect_format(tmp_path / "k.dat") == "items"
    with pytest.raises(DataError, match="pass --format"):
        detect_format(write_csv(tmp_path / "t.data"))


def test_one_table_format_per_name_for_every_reader(tmp_path: Path) -> None:
    """The log readers and the value reader read a name alike: ``.txt`` is tab-separated (as AOL's files)."""
    for name, kind in (("a.csv", "csv"), ("a.tsv.gz", "tsv"), ("a.tab", "tsv"), ("a.TXT.bz2", "tsv"),
                       ("a.parquet", "parquet"), ("a.pq", "parquet")):
        assert table_format(name) == kind
    assert table_format("a.data", "csv") == "csv"
    with pytest.raises(DataError, match="pass --format csv, tsv or parquet"):
        table_format("a.dat")
    txt = write_csv(tmp_path / "t.txt", sep="\t")
    assert load_table(txt, user_col="uid", query_col="q", url_col="link").n_records == 5
    (tmp_path / "v.txt").write_text("user\tvalue\n1\t2.5\n2\t-1\n")
    assert read_value_column(str(tmp_path / "v.txt"), "value").tolist() == [2.5, -1.0]


def test_load_log_dispatch(tmp_path: Path) -> None:
    aol = load_log(write_aol(tmp_path / "a.tsv"), user_col=None, skip_bad_rows=False)
    assert aol.has_urls and aol.n_records == len(CLICKS)
    tsv = load_log(write_csv(tmp_path / "t.tsv", sep="\t"), user_col="uid", query_col="q", url_col="link")
    assert tsv.n_records == 5
    (tmp_path / "k.dat").write_text(ITEMS_TEXT)
    items = load_log(tmp_path / "k.dat", keep_no_click=False, query_col="query")
    assert items.n_records == 12 and not items.has_urls
    forced = load_log(write_csv(tmp_path / "t.data"), format="CSV", user_col="uid", query_col="q")
    assert forced.n_records == 7
    with pytest.raises(DataError, match=r"unknown format 'xml'.*aol, csv, tsv, parquet, items"):
        load_log(tmp_path / "k.dat", format="xml")
    with pytest.raises(ParameterError, match="user_col"):
        load_log(tmp_path / "a.tsv", user_col="uid")
    with pytest.raises(DataError, match="file not found"):
        load_log(tmp_path / "missing.csv")


# --------------------------------------------------------------------------------------
# Files that are not what their name says, damaged files, awkward text
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "data", "needles"), [
    ("png.csv", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ["is not a text file", "NUL"]),
    ("log.csv", gzip.compress(b"uid,q\n1,a\n", mtime=0), ["gzip-compressed", "rename it to log.csv.gz"]),
    ("log.txt", gzip.compress(AOL_HEADER.encode() + b"\n", mtime=0), ["gzip-compressed", "log.txt.gz"]),
    ("t.csv", b"PAR1\x15\x04", ["Parquet file", "--format parquet"]),
    ("t.csv", "uid,q\n1,a\n".encode("utf-16"), ["UTF-16", "UTF-8"]),
    ("t.csv", b"PK\x03\x04\x14\x00", ["ZIP archive", "unpack"]),
    ("k.dat", b"1 2\x00\x01\x02 3\n", ["is not a text file"]),
    ("plain.csv.gz", b"uid,q\n1,a\n", ["not gzip-compressed", "rename it without .gz"]),
    ("double.csv.gz", gzip.compress(gzip.compress(b"uid,q\n1,a\n", mtime=0), mtime=0), ["compressed twice"]),
    ("empty.txt", b"", ["is empty"]),
])
def test_binary_or_misnamed_files_are_refused_with_the_fix(tmp_path: Path, name: str, data: bytes,
                                                          needles: list[str]) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    options = {"user_col": "uid", "query_col": "q"} if ".csv" in name else {}
    with pytest.raises(DataError) as info:
        load_log(path, **options)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize("name", ["a.txt.gz", "k.dat.gz", "t.csv.gz"])
def test_truncated_gzip_says_truncated(tmp_path: Path, name: str) -> None:
    text = AOL_HEADER + "\n" + "".join(f"{i}\tq{i % 7}\tt\t1\thttp://u{i % 5}\n" for i in range(3000))
    if name.startswith("t.csv"):
        text = "uid,q\n" + "".join(f"{i},q{i % 7}\n" for i in range(3000))
    full = gzip.compress(text.encode())
    for cut in (len(full) // 2, len(full) - 4, 12):
        path = tmp_path / name
        path.write_bytes(full[:cut])
        with pytest.raises(DataError, match="truncated") as info:
            load_log(path, **({"user_col": "uid", "query_col": "q"} if name.startswith("t.csv") else {}))
        assert "complete copy" in str(info.value)


def test_truncated_gzip_on_the_command_line_is_one_clean_error(tmp_path: Path) -> None:
    from clihelpers import assert_clean_error, invoke

    full = gzip.compress((AOL_HEADER + "\n" + "1\tq\tt\t1\thttp://a\n" * 5000).encode())
    path = tmp_path / "log.txt.gz"
    path.write_bytes(full[: len(full) // 2])
    result = invoke("run", "--input", path, ok=False)
    assert_clean_error(result, "truncated", str(path))
    assert "Aborted" not in result.output


def test_bad_row_with_invalid_utf8_is_skipped_like_any_bad_row(tmp_path: Path, monkeypatch) -> None:
    unraisable: list[object] = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)  # pyarrow reported failures here before
    path = tmp_path / "a.txt"
    path.write_bytes(AOL_HEADER.encode() + b"\n1\tq\tt\t1\thttp://a\n\xff\xfe bad row\n2\tq\xc3\tt\t1\thttp://b\n")
    with pytest.raises(DataError, match=r"line 3: expected 5 tab-separated fields, found 1; .*--skip-bad-rows"):
        load_aol(path)
    log = load_aol(path, skip_bad_rows=True)
    assert log.n_records == 2 and log.stats.rows_skipped_bad == 1
    assert sorted(log.queries.strings.tolist()) == ["q", "q\ufffd"]
    assert unraisable == []


def test_multibyte_characters_split_between_reads_survive(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(blocks, "BLOCK_SIZE", 64)  # many small reads: characters straddle them
    rows = [(str(i), f"café ☕ {'é' * (i % 5)} 𝄞", "t", "1", f"http://ü{i % 3}") for i in range(200)]
    log = load_aol(write_aol(tmp_path / "a.txt", rows=rows))
    assert log.n_records == 200
    assert all("\ufffd" not in s for s in log.queries.strings.tolist() + log.urls.strings.tolist())
    assert set(log.queries.decode(log.query)) == {r[1] for r in rows}


def test_line_longer_than_a_block_names_the_limit(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(blocks, "BLOCK_SIZE", 256)
    path = tmp_path / "t.csv"
    path.write_bytes(b"uid,q\n1,a\n2," + b"y" * 1000 + b"\n")
    with pytest.raises(DataError, match="a line is longer than 256 bytes"):
        load_table(path, user_col="uid", query_col="q")


def test_unclosed_quote_is_a_bad_row_not_a_swallowed_file(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b'uid,q\n1,a\n2,"never closed\n3,b\n4,c\n')
    with pytest.raises(DataError, match=r"line 3: a double quote opened in this row is never closed"):
        load_table(path, user_col="uid", query_col="q")
    log = load_table(path, user_col="uid", query_col="q", skip_bad_rows=True)
    assert log.queries.decode(log.query) == ["a"] and log.stats.rows_skipped_bad == 1


def test_old_mac_line_ends_and_header_without_line_end(tmp_path: Path) -> None:
    cr = tmp_path / "cr.csv"
    cr.write_bytes(b"uid,q\r1,a\r2,b\r")
    assert load_table(cr, user_col="uid", query_col="q").queries.decode([0, 1]) == ["a", "b"]
    header_only = tmp_path / "h.csv"
    header_only.write_bytes(b"uid,q")
    log = load_table(header_only, user_col="uid", query_col="q")
    assert log.n_records == 0 and log.stats.rows_read == 0


def test_nested_parquet_column_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"uid": ["a", "b"], "q": pa.array([[1, 2], [3]])}), path)
    with pytest.raises(DataError, match=r"column 'q' \(the query column\) has type list<.*string or a number"):
        load_table(path, user_col="uid", query_col="q")


def test_text_file_named_parquet_suggests_the_format(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"cannot read .* as Parquet: .*PAR1; if it is a CSV or TSV text file, pass"):
        load_log(path, user_col="uid", query_col="q")


def test_header_that_is_not_utf8_says_so(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"uid,q\xe9ry\n1,a\n")
    with pytest.raises(DataError, match=r"no column 'query'.*header is not valid UTF-8"):
        load_table(path, user_col="uid", query_col="query")
