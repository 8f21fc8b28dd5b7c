"""``hybriddp experiment``: outputs, consistency, missing points, resume and CLI errors (quick grids)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from clihelpers import assert_clean_error
from hybriddp.cli import cli
from hybriddp.experiments import DatasetSpec, run_experiment
from hybriddp.experiments.aggregate import mean_ci, point_stat, t_quantile_975
from hybriddp.experiments.codeversion import FAMILY_ROOTS, family_fingerprint, module_closure, normalized_code
from hybriddp.experiments.figures import DEFAULT_LINE, FIGURE_NAMES, METRIC_LABELS, Point, figures
from hybriddp.experiments.plots import ALGORITHM_LABELS
from hybriddp.experiments.runner import TrialStore, make_tasks, trial_seed
from hybriddp.tune import GRID_F_C, GRID_F_O
from logdata import write_aol, zipf_log

QUICK = ("--dataset", "aol", "--scale", "0.05", "--trials", "2", "--quick", "--jobs", "2")


def invoke(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def quick_all(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exp") / "aol"
    r = invoke("experiment", "all", *QUICK, "--out", out)
    assert r.exit_code == 0, r.output
    return out


def _num(v: str) -> float | None:
    return None if v == "" else float(v)


def test_all_outputs_exist(quick_all: Path) -> None:
    for name in FIGURE_NAMES:
        assert (quick_all / f"{name}.csv").is_file()
        png = quick_all / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for f in ("trials.csv", "summary.json", "report.md"):
        assert (quick_all / f).stat().st_size > 0
    assert not list(quick_all.glob(".*")), "temporary files left behind"  # io.atomic renamed every one


def test_summary_equals_figure_csvs(quick_all: Path) -> None:
    summary = json.loads((quick_all / "summary.json").read_text())
    assert summary["trials"] == 2 and summary["dataset"] == "aol"
    for name in FIGURE_NAMES[1:]:
        rows = read_csv(quick_all / f"{name}.csv")
        pts = summary["figures"][name]
        assert len(rows) == len(pts) > 0
        for row, pt in zip(rows, pts, strict=True):
            assert row["algorithm"] == pt["algorithm"] and row["metric"] == pt["metric"]
            assert int(row["head_list_size"]) == pt["head_list_size"]
            assert math.isclose(float(row["x"]), pt["x"])
            for k in ("mean", "lo", "hi"):
                v = _num(row[k])
                assert (v is None) == (pt[k] is None)
                if v is not None:
                    assert math.isclose(v, pt[k], rel_tol=1e-12)
            if pt["mean"] is not None:
                assert pt["lo"] <= pt["mean"] <= pt["hi"]
                assert pt["reached"] and pt["n_reached"] == pt["n_trials"] == 2
            else:
                assert not pt["reached"]


def test_missing_points_when_m_too_large(quick_all: Path) -> None:
    """M = 100 cannot be formed from ~26k synthetic users: every such point is missing (paper §4.2.3)."""
    summary = json.loads((quick_all / "summary.json").read_text())
    big = [p for p in summary["figures"]["fig13"] if p["head_list_size"] == 100]
    assert big and all(p["mean"] is None and not p["reached"] for p in big)
    assert any(p["mean"] is not None for p in summary["figures"]["fig12"])  # local-only reaches M = 10
    assert "—" in (quick_all / "report.md").read_text()


def test_trials_csv_rows_and_report_claims(quick_all: Path) -> None:
    rows = read_csv(quick_all / "trials.csv")
    assert {r["algorithm"] for r in rows} == {"blender", "optin-only", "client-only", "blender-pooled", "blender-reuse",
                                              "blender-consistent", "local-only", "local-only-hashed", "blender-tuned"}
    tuned = [r for r in rows if r["algorithm"] == "blender-tuned"]
    assert tuned and all(r["head_list_size"] == "10" and r["epsilon"] in ("2.0", "4.0") for r in tuned)
    for r in tuned:  # this tiny population forms no pilot list to fit: the error is kept, the point is missing
        assert r["error"] != "" or (float(r["tuned_f_o"]) in GRID_F_O and float(r["tuned_f_c"]) in GRID_F_C)
    assert all(r["tuned_f_o"] == "" for r in rows if r["algorithm"] != "blender-tuned")
    cols = ("algorithm", "epsilon", "optin_fraction", "f_c", "head_list_size", "trial")
    keys = [tuple(r[c] for c in cols) for r in rows]
    assert len(keys) == len(set(keys))  # every run once: figures share runs
    assert all(int(r["head_list_records"]) >= 0 and r["seed"] for r in rows)
    report = (quick_all / "report.md").read_text()
    assert "![fig14](fig14.png)" in report and "holds here" in report
    summary = json.loads((quick_all / "summary.json").read_text())
    assert summary["claims"] and all(c["holds"] in (True, False, None) for c in summary["claims"])
    fig12 = [c["paper"] for c in summary["claims"] if c["figure"] == "fig12"]
    assert any("tune" in c for c in fig12) and any("without a dictionary" in c for c in fig12)


def test_resume_runs_nothing_new(quick_all: Path) -> None:
    before = (quick_all / "trials.csv").read_text()
    r = invoke("experiment", "fig14", *QUICK, "--out", quick_all)
    assert r.exit_code == 0, r.output
    assert "0 new" in r.output
    assert (quick_all / "trials.csv").read_text() == before


def test_more_trials_add_only_new_runs(tmp_path: Path) -> None:
    spec = DatasetSpec("aol", seed=3, scale=0.05)
    first = run_experiment("fig15", spec, trials=1, out_dir=tmp_path, jobs=1, quick=True)
    second = run_experiment("fig16", spec, trials=2, out_dir=tmp_path, jobs=1, quick=True)
    assert first.n_ran == first.n_runs and second.n_runs == 2 * first.n_runs
    assert second.n_ran == first.n_runs  # fig16 reuses fig15's trial 0, runs trial 1
    assert set(second.figures) >= {"fig15", "fig16"}


def test_torn_last_row_is_run_again(tmp_path: Path) -> None:
    """A crash mid-write leaves a partial last line: that run alone is redone (rows are flushed per run)."""
    spec = DatasetSpec("aol", seed=3, scale=0.05)
    first = run_experiment("fig15", spec, trials=1, out_dir=tmp_path, jobs=1, quick=True)
    trials = tmp_path / "trials.csv"
    text = trials.read_text()
    trials.write_text(text[: text.rstrip("\n").rfind(",")])  # cut the last row inside its last fields
    again = run_experiment("fig15", spec, trials=1, out_dir=tmp_path, jobs=1, quick=True)
    assert first.n_ran == 8 and again.n_ran == 1  # 2 ε × 2 M × (paper's estimator, default estimator)
    assert run_experiment("fig15", spec, trials=1, out_dir=tmp_path, jobs=1, quick=True).n_ran == 0


def _small_store(src: Path, dst: Path, n_rows: int) -> bytes:
    """Copy the header and the first ``n_rows`` lines of ``src``'s trials.csv (and its tables) to ``dst``."""
    dst.mkdir()
    lines = (src / "trials.csv").read_bytes().splitlines(keepends=True)
    data = b"".join(lines[:1 + n_rows])
    (dst / "trials.csv").write_bytes(data)
    (dst / "fig9_tables.jsonl").write_bytes((src / "fig9_tables.jsonl").read_bytes())
    return data


def test_a_torn_last_row_is_dropped_at_every_cut_and_reported(quick_all: Path, tmp_path: Path, caplog) -> None:
    """A kill can cut the last appended line anywhere: every cut leaves the earlier rows readable,
    the cut row is dropped with a warning, and the file is repaired (rewritten) before any append."""
    data = _small_store(quick_all, tmp_path / "o", 5)
    path = tmp_path / "o" / "trials.csv"
    whole = TrialStore(tmp_path / "o")
    assert len(whole.rows) == 5 and whole.torn == []
    keep = set(list(whole.rows)[:4])
    last_start = data.rstrip(b"\r\n").rfind(b"\n") + 1
    assert data.endswith(b"\r\n")
    for cut in range(last_start + 1, len(data)):  # "\r" without its "\n" is a cut, too
        path.write_bytes(data[:cut])
        with caplog.at_level("WARNING"):
            caplog.clear()
            store = TrialStore(tmp_path / "o")
        assert set(store.rows) == keep, cut
        assert store.torn == [path] and "cut off" in caplog.text
        assert path.read_bytes().endswith(b"\n")  # repaired: the next append starts on a line of its own
        assert set(TrialStore(tmp_path / "o").rows) == keep


def test_a_torn_fig9_table_line_is_dropped(quick_all: Path, tmp_path: Path) -> None:
    _small_store(quick_all, tmp_path / "o", 5)
    tables = tmp_path / "o" / "fig9_tables.jsonl"
    lines = tables.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 2
    tables.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    store = TrialStore(tmp_path / "o")
    assert len(store.tables) == len(lines) - 1 and store.torn == [tables]
    assert tables.read_bytes() == b"".join(lines[:-1])


def test_out_dir_is_checked_before_the_data_is_loaded(tmp_path: Path, monkeypatch) -> None:
    def no_load(self: DatasetSpec) -> None:
        raise AssertionError("loaded the data before checking --out")

    monkeypatch.setattr(DatasetSpec, "load", no_load)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out, needle in ((a_file, "is a file"), (a_file / "sub", "cannot create")):
        r = invoke("experiment", "fig11", "--dataset", "aol", "--out", out)
        assert_clean_error(r, "--out", str(out), needle)
    fresh = tmp_path / "new" / "dir"  # created when missing
    with pytest.raises(AssertionError, match="loaded the data"):
        run_experiment("fig11", DatasetSpec("aol"), out_dir=fresh, quick=True)
    assert fresh.is_dir()


def test_log_file_dataset_row_per_user(tmp_path: Path) -> None:
    path = tmp_path / "log.tsv"
    write_aol(zipf_log(n_users=3000, n_queries=30, max_records=3, seed=1), path)
    res = run_experiment("fig11", DatasetSpec(str(path), row_per_user=True), trials=2, out_dir=tmp_path / "o",
                         jobs=1, quick=True)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["kind"] == "file" and summary["n_users"] == summary["n_records"]
    assert summary["params"]["delta"] == pytest.approx(min(1e-5, 1 / summary["n_users"]))
    assert res.n_ran == res.n_runs == 8  # 2 f_C × 2 trials × (paper's estimator, default estimator)


def test_seeds_deterministic_and_distinct() -> None:
    p = Point(4.0, 1e-5, 0.05, 0.85, 50)
    assert trial_seed(0, 1, p) == trial_seed(0, 1, Point(4.0, 1e-5, 0.05, 0.85, 50))
    assert len({trial_seed(0, t, p) for t in range(5)} | {trial_seed(1, 0, p)}) == 6
    fig = figures("aol")
    tasks = make_tasks([("blender", pt) for _, _, pt in fig["fig14"].points(p)]
                       + [("blender", pt) for _, _, pt in fig["fig13"].points(p)], 3, 0)
    assert len(tasks) == 3 * 13 * 4  # fig13 and fig14: one set of runs


def test_mean_ci() -> None:
    import scipy.stats as scipy_stats
    for df in (1, 2, 5, 29, 30, 31, 60, 500):
        assert t_quantile_975(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=2e-3)
    assert mean_ci([0.5]) == (0.5, 0.5, 0.5)
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0
    assert hi - m == pytest.approx(4.303 / math.sqrt(3)) and m - lo == pytest.approx(hi - m)
    rows = [{"head_list_records": 50, "ndcg": 0.9, "error": None},
            {"head_list_records": 49, "ndcg": 0.8, "error": None}]
    st = point_stat(rows, "blender", 0.05, "ndcg", 50)
    assert st.mean is None and st.n_reached == 1 and not st.reached


@pytest.mark.parametrize(("args", "needle"), [
    (("experiment", "fig10", "--dataset", "aol"), "fig10"),
    (("experiment", "fig11", "--dataset", "/no/such/log.tsv"), "/no/such/log.tsv"),
    (("experiment", "fig11", "--dataset", "aol", "--row-per-user"), "--row-per-user"),
    (("experiment", "fig11", "--dataset", "aol", "--trials", "0"), "trials"),
])
def test_cli_errors_one_line(args, needle) -> None:
    r = invoke(*args)
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]


def test_sizes_figure_sweeps_m_for_blender_and_both_local_baselines(quick_all: Path) -> None:
    summary = json.loads((quick_all / "summary.json").read_text())
    pts = summary["figures"]["sizes"]
    assert {p["algorithm"] for p in pts} == {"blender", "blender-reuse", "local-only", "local-only-hashed"}
    assert {p["metric"] for p in pts} == {"ndcg", "l1", "l1_union"}
    assert all(p["head_list_size"] == p["x"] for p in pts)  # the x axis is M itself
    assert sorted({p["x"] for p in pts}) == [10, 100]  # quick grid: smallest and largest M
    assert any(c["figure"] == "sizes" for c in summary["claims"])
    assert "| head_list_size |" in (quick_all / "report.md").read_text()


def test_rows_of_older_code_are_run_again_and_replaced(tmp_path: Path, caplog) -> None:
    spec = DatasetSpec("aol", seed=3, scale=0.05)
    first = run_experiment("fig15", spec, trials=1, out_dir=tmp_path, jobs=1, quick=True)
    trials = tmp_path / "trials.csv"
    rows = read_csv(trials)
    assert {r["code"] for r in rows} == {family_fingerprint("blender")}
    for r in rows:
        r["code"] = "000000000000"  # as if an older version of the algorithms had made them
    with trials.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with caplog.at_level("WARNING"):
        again = run_experiment("fig15", spec, trials=1, out_dir=tmp_path, jobs=1, quick=True)
    assert again.n_ran == first.n_runs and "different algorithm code" in caplog.text
    assert run_experiment("fig15", spec, trials=1, out_dir=tmp_path, jobs=1, quick=True).n_ran == 0
    rows = read_csv(trials)  # the stale rows were replaced, not kept beside the new ones
    # one row per algorithm of each run, no stale duplicates: half the runs are BLENDER's (4 algorithms each),
    # half the default estimator's (blender-reuse and blender-consistent)
    assert len(rows) == (4 + 2) * first.n_runs // 2
    assert {r["code"] for r in rows} == {family_fingerprint("blender")}


def test_code_fingerprint_ignores_documentation_not_code() -> None:
    a = 'def f(x):\n    """Doc."""\n    return x + 1  # comment\n'
    b = 'def f(x):\n    """Other words."""\n\n    return x + 1\n'
    c = 'def f(x):\n    """Doc."""\n    return x + 2\n'
    assert normalized_code(a) == normalized_code(b) != normalized_code(c)
    blender = module_closure(FAMILY_ROOTS["blender"])
    assert {"hybriddp.simulation.pipeline", "hybriddp.curator.mechanisms", "hybriddp.simulation.baselines.pem",
            "hybriddp.simulation.scoring"} <= set(blender)
    assert not any(m.startswith(("hybriddp.cli", "hybriddp.experiments", "hybriddp.tune")) for m in blender)
    tuned = module_closure(FAMILY_ROOTS["blender-tuned"])
    assert {"hybriddp.tune.search", "hybriddp.experiments.tuned"} <= set(tuned)
    assert family_fingerprint("blender") != family_fingerprint("blender-tuned")


def test_estimators_figure_pairs_the_papers_blend_with_the_pooled_one(quick_all: Path) -> None:
    summary = json.loads((quick_all / "summary.json").read_text())
    pts = summary["figures"]["estimators"]
    assert {p["algorithm"] for p in pts} == {"blender", "blender-pooled", "blender-reuse", "blender-consistent"}
    assert {p["metric"] for p in pts} == {"l1", "l1_union", "l1_queries", "ndcg", "ndcg_queries_at_10"}
    rows = read_csv(quick_all / "trials.csv")
    paper = {(r["epsilon"], r["trial"]) for r in rows if r["algorithm"] == "blender"}
    for algo in ("blender-pooled", "blender-reuse", "blender-consistent"):
        mine = {(r["epsilon"], r["trial"]) for r in rows if r["algorithm"] == algo}
        assert mine and mine <= paper


def test_blender_family_pooled_member_is_the_same_run_blended_with_pooled_weights() -> None:
    """``blender-pooled`` shares the run (head list, samples, truth) and differs only in its weights:
    with ``estimator="pooled"`` the family's ``blender`` is the same result."""
    from dataclasses import replace

    from hybriddp.core.params import BlenderParams
    from hybriddp.simulation.algorithms import blender_family

    log = zipf_log(3_000, seed=4)
    params = BlenderParams(epsilon=4.0, optin_fraction=0.3, head_list_size=10, estimator="paper")
    paper = blender_family(log, params, seed=9)
    pooled = blender_family(log, replace(params, estimator="pooled"), seed=9)
    assert paper["blender-pooled"].p_record.tolist() == pooled["blender"].p_record.tolist()
    assert paper["blender-pooled"].metrics == pooled["blender"].metrics
    assert paper["blender"].p_record.tolist() != paper["blender-pooled"].p_record.tolist()
    assert paper["blender"].head_list.query_ids.tolist() == paper["blender-pooled"].head_list.query_ids.tolist()



def test_blender_reuse_is_a_run_of_its_own_paired_by_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``blender-reuse`` family runs BLENDER with ``estimator="reuse"`` on the point's seed: the same
    S/T split and samples as the point's ``blender`` run (so the same HL_S), its own trimmed list and
    estimates; a row of its own in trials.csv. ``blender-consistent`` is that run made consistent (§7.1): the
    same result as a run with ``estimator="consistent"``."""
    from dataclasses import replace

    from hybriddp.core.params import BlenderParams
    from hybriddp.experiments import runner
    from hybriddp.experiments.figures import Point
    from hybriddp.simulation.algorithms import blender_family
    from hybriddp.simulation.pipeline import run_blender

    log = zipf_log(3_000, seed=4)
    point = Point.of(BlenderParams(epsilon=4.0, optin_fraction=0.3, head_list_size=10))
    monkeypatch.setattr(runner, "_LOG", log)
    rows, table = runner.run_task(runner.Task("blender-reuse", point, 0, 9), "test")
    assert [r["algorithm"] for r in rows] == ["blender-reuse", "blender-consistent"] and table is None
    assert not rows[0]["error"] and not rows[1]["error"]
    reuse = run_blender(log, replace(point.params(), estimator="reuse"), seed=9)
    paper = run_blender(log, point.params(), seed=9)
    assert reuse.curator.head_list_s.query_ids.tolist() == paper.curator.head_list_s.query_ids.tolist()
    assert reuse.curator.optin.reused is not None and paper.curator.optin.reused is None
    assert rows[0]["l1"] == pytest.approx(blender_family(log, replace(point.params(), estimator="reuse"),
                                                         seed=9)["blender"].metrics["l1"])
    consistent = run_blender(log, replace(point.params(), estimator="consistent"), seed=9).result()
    assert rows[1]["l1"] == pytest.approx(consistent.metrics["l1"]) and rows[1]["l1"] != rows[0]["l1"]
    eq = consistent.head_list.entry_query  # published: the sum of the published entries; raw: of the raw ones
    assert consistent.p_query.tolist() == pytest.approx(np.bincount(eq, weights=consistent.p_record).tolist())
    assert consistent.blended.queries.p.tolist() == pytest.approx(
        np.bincount(eq, weights=consistent.blended.records.p).tolist())


def test_every_figure_draws_the_default_estimator_next_to_the_papers(quick_all: Path) -> None:
    """What ships (``--estimator reuse``, the default) is a line of every figure, beside the paper's estimator,
    and every L1 panel has the union L1 beside it (ALGORITHM.md §9)."""
    assert DEFAULT_LINE == "blender-reuse"  # DEFAULT_ESTIMATOR is "reuse" (core/estimators.py)
    defs = figures("aol", quick=True)
    for name, fig in defs.items():
        assert "blender" in fig.algorithms and "blender-reuse" in fig.algorithms, name
        assert ("l1" in fig.metrics) <= ("l1_union" in fig.metrics), name
    assert "blender-tuned" in defs["fig12"].algorithms and "l1_union" in METRIC_LABELS
    summary = json.loads((quick_all / "summary.json").read_text())
    for name in FIGURE_NAMES[1:]:
        assert {"blender", "blender-reuse"} <= {p["algorithm"] for p in summary["figures"][name]}, name
    assert summary["figures"]["fig9"]["default"]["estimator"] == "reuse"
    assert {p["metric"] for p in summary["figures"]["fig12"]} == {"ndcg_queries_at_10", "l1_union"}
    # the legends name the estimator, and say which one is the default
    assert "estimator paper" in ALGORITHM_LABELS["blender"] and "default" not in ALGORITHM_LABELS["blender"]
    assert "estimator reuse, the default" in ALGORITHM_LABELS["blender-reuse"]
    assert "estimator reuse" in ALGORITHM_LABELS["blender-tuned"]


def test_trials_csv_and_report_name_each_lines_estimator(quick_all: Path) -> None:
    rows = read_csv(quick_all / "trials.csv")
    want = {"blender": "paper", "optin-only": "paper", "client-only": "paper", "blender-pooled": "pooled",
            "blender-reuse": "reuse", "blender-consistent": "consistent", "blender-tuned": "reuse",
            "local-only": "", "local-only-hashed": ""}
    assert {r["algorithm"] for r in rows} == set(want)
    for r in rows:
        assert r["estimator"] == want[r["algorithm"]], r["algorithm"]
        if r["l1"] and r["l1_union"]:  # the union holds the list: it can only add what the list misses
            assert float(r["l1_union"]) >= float(r["l1"]) - 1e-12
    assert any(r["l1_union"] for r in rows)
    report = (quick_all / "report.md").read_text()
    lines = report[report.index("## Lines"):report.index("## The paper's claims")]
    assert "| `blender` | BLENDER (estimator paper, as published) | `paper` |" in lines
    assert "| `blender-reuse` |" in lines and "| `reuse` (the default) |" in lines
    tuned = next(line for line in lines.splitlines() if line.startswith("| `blender-tuned` |"))
    assert "`reuse` (the default)" in tuned and "tune" in tuned


def test_rows_written_before_the_estimator_column_get_their_lines_estimator(tmp_path: Path) -> None:
    """An older trials.csv (no ``estimator`` column) is read with each line's estimator filled in, and rewritten
    with today's columns."""
    from hybriddp.experiments.runner import COLUMNS, KEY_COLUMNS

    old = [c for c in COLUMNS if c not in ("estimator", "l1_union")]
    lines = [",".join(old)]
    for algorithm in ("blender", "blender-reuse"):
        row = {"data": "d", "algorithm": algorithm, "epsilon": "1.0", "delta": "1e-05", "optin_fraction": "0.05",
               "f_c": "0.85", "head_list_size": "10", "trial": "0", "seed": "7", "family": algorithm}
        lines.append(",".join(row.get(c, "") for c in old))
    (tmp_path / "trials.csv").write_text("\n".join(lines) + "\n")
    store = TrialStore(tmp_path)
    got = {r["algorithm"]: r["estimator"] for r in store.rows.values()}
    assert got == {"blender": "paper", "blender-reuse": "reuse"}
    assert (tmp_path / "trials.csv").read_text().splitlines()[0].split(",") == list(COLUMNS)
    assert set(KEY_COLUMNS) <= set(COLUMNS)
