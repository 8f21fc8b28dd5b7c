"""The `hybriddp` command line: every command, and bad input answered in one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from clihelpers import assert_clean_error, invoke
from logdata import write_aol, write_csv, zipf_log


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    log = zipf_log(n_users=12_000, seed=5)
    write_aol(log, d / "log.tsv")
    write_csv(log, d / "log.csv")
    return d


RUN = ("--optin-fraction", "0.3", "--head-list-size", "30", "--seed", "3")


def test_run_prints_figure9_and_metrics(files) -> None:
    r = invoke("run", "--input", files / "log.tsv", *RUN)
    assert "Fig. 9" in r.stdout and "true p_q" in r.stdout
    assert "L1 " in r.stdout and "NDCG" in r.stdout
    assert "experiments only" in r.stderr  # seeded runs say they carry no privacy


def test_run_json_and_outputs(files, tmp_path) -> None:
    r = invoke("run", "--input", files / "log.tsv", *RUN, "--json", "--output", tmp_path / "res.parquet")
    obj = json.loads(r.stdout)
    for key in ("ndcg", "l1", "head_list_records", "head_list_queries", "epsilon", "delta"):
        assert key in obj
    assert obj["head_list_records"] == 30 and obj["epsilon"] == 4.0 and 0 < obj["ndcg"] <= 1
    assert obj["seed"] == 3 and "warning" in obj
    table = pq.read_table(tmp_path / "res.parquet")
    assert table.num_rows == 30 + obj["head_list_queries"] + 1  # records + ⟨q,*⟩ + ⟨*,*⟩
    assert {"p_blended", "p_optin", "p_client", "weight_optin", "p_true"} <= set(table.column_names)
    invoke("run", "--input", files / "log.tsv", *RUN, "--output", tmp_path / "res.csv")
    assert (tmp_path / "res.csv").read_text().startswith('"query","url"')


def test_run_csv_columns(files) -> None:
    r = invoke("run", "--input", files / "log.csv", "--user-col", "uid", "--query-col", "q", "--url-col",
               "clicked", *RUN, "--json")
    assert json.loads(r.stdout)["head_list_records"] == 30


def test_file_workflow_reproduces_run(files, tmp_path) -> None:
    """headlist → randomize → estimate gives run's estimates exactly (same data and seed)."""
    log = files / "log.tsv"
    run_obj = json.loads(invoke("run", "--input", log, *RUN, "--json").stdout)
    hl, est, rep = tmp_path / "hl.json", tmp_path / "optin.json", tmp_path / "reports.jsonl.gz"
    invoke("headlist", "--input", log, *RUN, "--out-headlist", hl, "--out-estimates", est)
    doc = json.loads(hl.read_text())
    assert set(doc) >= {"queries", "epsilon", "delta", "f_c", "m_c", "content_hash"}
    assert "p_record" not in hl.read_text()  # no estimates go to devices
    invoke("randomize", "--headlist", hl, "--input", log, "--optin-fraction", "0.3", "--seed", "3",
           "--output", rep)
    out = json.loads(invoke("estimate", "--headlist", hl, "--optin-estimates", est, "--reports", rep,
                            "--json").stdout)

    def key(rows):
        return [(r["query"], r["url"], r["p_optin"], r["p_client"], r["p_blended"]) for r in rows]

    assert key(out["records"]) == key(run_obj["records"])
    assert [r["p_blended"] for r in out["queries"]] == [r["p_blended"] for r in run_obj["queries"]]


def test_estimator_option_reaches_run_and_estimate(files, tmp_path) -> None:
    """--estimator pooled: run and the file workflow agree, say so in their parameters, and blend
    differently from the paper's weights (the same opt-in and client estimates)."""
    log = files / "log.tsv"
    paper = json.loads(invoke("run", "--input", log, *RUN, "--estimator", "paper", "--json").stdout)
    pooled = json.loads(invoke("run", "--input", log, *RUN, "--estimator", "pooled", "--json").stdout)
    assert (paper["params"]["estimator"], pooled["params"]["estimator"]) == ("paper", "pooled")
    assert [r["p_optin"] for r in pooled["records"]] == [r["p_optin"] for r in paper["records"]]
    assert [r["p_blended"] for r in pooled["records"]] != [r["p_blended"] for r in paper["records"]]
    hl, est, rep = tmp_path / "hl.json", tmp_path / "optin.json", tmp_path / "reports.jsonl.gz"
    invoke("headlist", "--input", log, *RUN, "--estimator", "paper", "--out-headlist", hl, "--out-estimates", est)
    invoke("randomize", "--headlist", hl, "--input", log, "--optin-fraction", "0.3", "--seed", "3", "--output", rep)
    out = json.loads(invoke("estimate", "--headlist", hl, "--optin-estimates", est, "--reports", rep,
                            "--estimator", "pooled", "--json").stdout)
    assert [r["p_blended"] for r in out["records"]] == [r["p_blended"] for r in pooled["records"]]
    assert out["params"]["estimator"] == "pooled"
    bad = invoke("run", "--input", log, *RUN, "--estimator", "median", ok=False)
    assert bad.exit_code == 2 and "median" in bad.output and "pooled" in bad.output


def test_randomize_production_path_and_single_device(files, tmp_path) -> None:
    hl, est = tmp_path / "hl.json", tmp_path / "optin.json"
    invoke("headlist", "--input", files / "log.tsv", "--head-list-size", "20", "--out-headlist", hl,
           "--out-estimates", est)
    r = invoke("randomize", "--headlist", hl, "--input", files / "log.tsv", "--output", tmp_path / "r.jsonl")
    assert "experiments only" not in r.stderr
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == 12_000 + 2  # header, one line per device, end line
    assert json.loads(lines[0])["format"] == "hybriddp-reports"
    assert json.loads(lines[-1]) == {"end": True, "messages": 12_000, "reports": 12_000}
    msg = json.loads(lines[1])
    assert msg["headlist"] == json.loads(hl.read_text())["content_hash"] and len(msg["reports"]) == 1
    assert len({json.loads(line)["id"] for line in lines[1:-1]}) == 12_000  # fresh random ids
    invoke("randomize", "--headlist", hl, "--input", files / "log.tsv", "--single-device", "--output",
           tmp_path / "one.jsonl")
    assert len((tmp_path / "one.jsonl").read_text().splitlines()) == 3
    r = invoke("estimate", "--headlist", hl, "--optin-estimates", est, "--reports", tmp_path / "r.jsonl")
    assert "no ground truth" in r.stdout


def test_estimate_rejects_reports_for_another_head_list(files, tmp_path) -> None:
    for name, m in (("a", "20"), ("b", "10")):
        invoke("headlist", "--input", files / "log.tsv", "--head-list-size", m, "--seed", "1",
               "--out-headlist", tmp_path / f"{name}.json", "--out-estimates", tmp_path / f"{name}-est.json")
    invoke("randomize", "--headlist", tmp_path / "b.json", "--input", files / "log.tsv", "--output",
           tmp_path / "rb.jsonl")
    r = invoke("estimate", "--headlist", tmp_path / "a.json", "--optin-estimates", tmp_path / "a-est.json",
               "--reports", tmp_path / "rb.jsonl", ok=False)
    assert_clean_error(r, "line 2", "head list")
    r = invoke("estimate", "--headlist", tmp_path / "a.json", "--optin-estimates", tmp_path / "b-est.json",
               "--reports", tmp_path / "rb.jsonl", ok=False)
    assert_clean_error(r, "b-est.json")


@pytest.mark.parametrize(("args", "needles"), [
    (("run", "--input", "{d}/missing.tsv"), ("missing.tsv",)),
    (("run", "--input", "{d}/log.tsv", "--epsilon", "0.5"), ("epsilon (--epsilon) = 0.5", "ln 2")),
    (("run", "--input", "{d}/log.tsv", "--epsilon", "0.6931"), ("--epsilon",)),
    (("run", "--input", "{d}/log.tsv", "--delta", "1"), ("delta (--delta) = 1.0", "between 0 and 1")),
    (("run", "--input", "{d}/log.tsv", "--delta", "2.5"), ("--delta",)),
    (("run", "--input", "{d}/log.tsv", "--optin-fraction", "0.0005"), ("6 opt-in users", "--optin-fraction 0.000917")),
    (("run", "--input", "{d}/log.csv", "--user-col", "nope", "--url-col", "clicked"), ("nope",)),
    (("run", "--input", "{d}/log.csv", "--user-col", "uid", "--query-col", "query_text"), ("query_text",)),
    (("run", "--input", "{d}/log.tsv", "--output", "{d}/x.xlsx"), (".xlsx",)),
    (("headlist", "--input", "{d}/log.tsv", "--f-o", "1.5"), ("f_o (--f-o) = 1.5",)),
    (("randomize", "--headlist", "{d}/nope.json", "--input", "{d}/log.tsv"), ("nope.json", "not found")),
    (("estimate", "--headlist", "{d}/nope.json", "--optin-estimates", "x", "--reports", "y"), ("not found",)),
])
def test_bad_input_one_line_exit_2(files, args, needles) -> None:
    r = invoke(*(a.format(d=files) for a in args), ok=False)
    assert_clean_error(r, *needles)
    assert len((r.stderr or "").strip().splitlines()) == 1


def test_malformed_row_names_file_and_line(files, tmp_path) -> None:
    bad = tmp_path / "bad.tsv"
    text = (files / "log.tsv").read_text().splitlines()
    text[5] = "notanumber\tquery\t2006-03-01 10:00:00\t1\thttp://x"
    bad.write_text("\n".join(text) + "\n")
    r = invoke("run", "--input", bad, *RUN, ok=False)
    assert_clean_error(r, "bad.tsv", "line 6")
    r = invoke("run", "--input", bad, *RUN, "--skip-bad-rows")
    assert "skipped 1" in r.stderr


def test_help_lists_units_and_defaults() -> None:
    r = invoke("run", "--help")
    for needle in ("--epsilon", "default: 4.0", "--delta", "--optin-fraction", "0.05 = 5%", "--head-list-size",
                   "--seed", "NO privacy", "--json", "--output"):
        assert needle in r.output, needle


def test_real_entry_point_has_no_traceback(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "hybriddp", "run", "--input", str(tmp_path / "none.tsv")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_demo_small_scale_json() -> None:
    r = invoke("demo", "--scale", "0.05", "--optin-fraction", "0.2", "--seed", "2", "--json")
    obj = json.loads(r.stdout)
    assert obj["sizes"]["users"] == round(0.05 * 519_371)
    assert obj["head_list_records"] > 0 and 0 < obj["ndcg"] <= 1
    assert obj["figure9"][0]["query"] == "google"  # the calibrated head: google is the top query


def test_reuse_estimator_through_the_file_workflow(files, tmp_path) -> None:
    """The default estimator (reuse) reuses S: the curator's estimates file (version 3) marks the reused
    records and carries |D_S|; `estimate` reproduces `run` from the files, may switch to `consistent` (the same
    opt-in estimates, with the consistency step), and refuses to switch the release to an estimator that
    does not reuse S (that is the curator's choice) with exit 2."""
    log = files / "log.tsv"
    paper = json.loads(invoke("run", "--input", log, *RUN, "--estimator", "paper", "--json").stdout)
    reuse = json.loads(invoke("run", "--input", log, *RUN, "--json").stdout)
    assert reuse["params"]["estimator"] == "reuse"
    assert reuse["head_list_records"] == paper["head_list_records"]  # M records either way, ranked by S ∪ T
    assert [r["p_optin"] for r in reuse["records"]] != [r["p_optin"] for r in paper["records"]]
    hl, est, rep = tmp_path / "hl.json", tmp_path / "optin.json", tmp_path / "reports.jsonl.gz"
    invoke("headlist", "--input", log, *RUN, "--out-headlist", hl, "--out-estimates", est)
    doc = json.loads(est.read_text())
    assert doc["version"] == 3 and doc["n_s"] > 0 and sum(doc["reused"]) == reuse["head_list_records"]
    assert "reused" not in hl.read_text() and "p_record" not in hl.read_text()  # devices get the lists only
    invoke("randomize", "--headlist", hl, "--input", log, "--optin-fraction", "0.3", "--seed", "3", "--output", rep)
    out = json.loads(invoke("estimate", "--headlist", hl, "--optin-estimates", est, "--reports", rep,
                            "--json").stdout)
    assert [r["p_blended"] for r in out["records"]] == [r["p_blended"] for r in reuse["records"]]
    made_consistent = json.loads(invoke("estimate", "--headlist", hl, "--optin-estimates", est, "--reports", rep,
                              "--estimator", "consistent", "--json").stdout)
    assert made_consistent["params"]["estimator"] == "consistent" and made_consistent["records"] != out["records"]
    bad = invoke("estimate", "--headlist", hl, "--optin-estimates", est, "--reports", rep, "--estimator", "paper",
                 ok=False)
    assert bad.exit_code == 2 and "reuse" in bad.output and "Traceback" not in bad.output


def test_human_output_names_the_estimator(files) -> None:
    """Estimates differ by estimator, so the human summary says which one made them."""
    log = files / "log.tsv"
    assert "estimator: reuse" in invoke("run", "--input", log, *RUN).stdout  # the default
    assert "estimator: paper — BLENDER as published" in invoke("run", "--input", log, *RUN, "--estimator",
                                                                 "paper").stdout


def test_consistent_estimator_makes_every_query_the_sum_of_its_entries(files) -> None:
    """--estimator consistent (ALGORITHM.md §7.1): in the JSON every query's p_blended_raw is the sum of its
    entries' unprojected blends (URLs and ⟨q,*⟩) and its published p_blended the sum of its entries' published
    p_blended, which --estimator reuse does not give; the text output names it."""
    log = files / "log.tsv"
    sums = {}
    for est in ("reuse", "consistent"):
        doc = json.loads(invoke("run", "--input", log, *RUN, "--estimator", est, "--json").stdout)
        assert doc["params"]["estimator"] == est
        for col in ("p_blended_raw", "p_blended"):
            total: dict[str, float] = {}
            for r in doc["records"]:
                total[r["query"]] = total.get(r["query"], 0.0) + r[col]
            sums[est, col] = max(abs(total[q["query"]] - q[col]) for q in doc["queries"] if q["query"] in total)
    for col in ("p_blended_raw", "p_blended"):
        assert sums["consistent", col] < 1e-12 < 1e-6 < sums["reuse", col], sums
    assert "estimator: consistent" in invoke("run", "--input", log, *RUN, "--estimator", "consistent").stdout


def test_the_ranking_guard_options_reach_the_result(files) -> None:
    """``--anchor-kappa-query`` is chosen per round by default (``auto``, within ``--anchor-rank-cost``) or fixed by a
    number (ALGORITHM.md §7.2); the result says which and, for ``auto``, what the round chose; a bad value is one
    clean line."""
    log = files / "log.tsv"
    auto = json.loads(invoke("run", "--input", log, *RUN, "--anchor-rank-cost", "0.004", "--json").stdout)
    fixed = json.loads(invoke("run", "--input", log, *RUN, "--anchor-kappa-query", "0.1", "--json").stdout)
    assert fixed["anchor_check"]["kappa_query"] == 0.1
    assert auto["anchor_check"]["kappa_query"] == "auto" and auto["anchor_check"]["rank_cost"] == 0.004
    assert auto["anchor_check"]["kappa_query_round"] >= 0.0 and "kappa_query_round" not in fixed["anchor_check"]
    assert_clean_error(invoke("run", "--input", log, *RUN, "--anchor-kappa-query", "loose", ok=False),
                       "--anchor-kappa-query", "'loose'", "auto")
    assert_clean_error(invoke("run", "--input", log, *RUN, "--anchor-kappa-query", "auto", "--anchor-rank-cost",
                              "1.5", ok=False), "--anchor-rank-cost", "1.5")
