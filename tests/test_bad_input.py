"""Every bad input → one `error:` line, exit status 2, no traceback, earlier outputs unchanged (issue 9).

Each case runs the real command line (``tests/clihelpers.invoke``). Cases that name an output
path point it at a file (or directory) made before the run, and check afterwards that its bytes
are the same: a refused command must not touch what an earlier run wrote.

The first section is the parameter / command-line side (seeds, ε where e^x overflows, f_C where
LocalAlg's estimator would divide by rounding error, absurd trial counts and sizes, misleading
hints, too few users). The second section, marked SEAM, is the acceptance of the file workflow
(headlist → randomize → estimate): damaged inputs and refused rounds.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clihelpers import invoke
from logdata import write_aol, write_csv, zipf_log

LN_MAX = math.log(sys.float_info.max)  # e^x overflows a double beyond x = 709.78...


def _canonical_hash(doc: dict) -> str:
    """``sha256:`` of the canonical JSON without ``content_hash`` (docs/FORMATS.md), to re-sign edited files."""
    body = {k: v for k, v in doc.items() if k != "content_hash"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _resigned(doc: dict, **changes: object) -> str:
    out = dict(doc)
    out.update(changes)
    out["content_hash"] = _canonical_hash(out)
    return json.dumps(out)  # NaN stays NaN (allow_nan): the reader must refuse it


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    """A small log, the file workflow's outputs made from it, and damaged copies of them."""
    d = tmp_path_factory.mktemp("bad_input")
    log = zipf_log(n_users=3000, seed=5, n_queries=60)
    write_aol(log, d / "log.tsv")
    write_csv(log, d / "log.csv")  # columns uid, q, clicked
    write_aol(zipf_log(n_users=130, max_records=300, seed=3, n_queries=50), d / "small.tsv")
    (d / "values.csv").write_text("v\n" + "\n".join(str((i * 37 % 101) / 10) for i in range(200)) + "\n")
    invoke("headlist", "--input", d / "log.tsv", "--optin-fraction", "0.3", "--head-list-size", "20", "--seed", "3",
           "--out-headlist", d / "hl.json", "--out-estimates", d / "est.json", "--ledger", d / "ledger.db",
           "--lifetime-epsilon", "100", "--lifetime-delta", "0.01")
    invoke("randomize", "--headlist", d / "hl.json", "--input", d / "log.tsv", "--optin-fraction", "0.3",
           "--seed", "3", "--output", d / "rep.jsonl")

    noise = bytes(range(256)) * 40
    (d / "bin.csv").write_bytes(noise)
    (d / "bin.jsonl").write_bytes(noise)
    (d / "latin1.jsonl").write_bytes('{"format": "hybriddp-reports", "caf\xe9": 1}\n'.encode("latin-1"))
    raw = (d / "rep.jsonl").read_bytes()
    packed = gzip.compress(raw)
    (d / "truncated.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    lines = raw.decode("utf-8").splitlines()
    header, first, rest, trailer = lines[0], json.loads(lines[1]), lines[2:-1], json.loads(lines[-1])
    doubled = dict(first, reports=first["reports"] * 2)  # m_C = 1: two reports in one message
    (d / "too_many.jsonl").write_text("\n".join(
        [header, json.dumps(doubled), *rest, json.dumps(dict(trailer, reports=trailer["reports"] + 1))]) + "\n")
    (d / "duplicated.jsonl").write_text("\n".join(
        [header, lines[1], lines[1], *rest,
         json.dumps(dict(trailer, messages=trailer["messages"] + 1, reports=trailer["reports"] + 1))]) + "\n")

    est = json.loads((d / "est.json").read_text())
    p = est["p_record"]
    for name, change in (("n_zero", {"n": 0}), ("n_negative", {"n": -5}),
                         ("variance_negative", {"noise_variance": -1.0}), ("null", {"p_record": [None, *p[1:]]}),
                         ("nan", {"p_record": [float("nan"), *p[1:]]})):
        (d / f"est_{name}.json").write_text(_resigned(est, **change))
    hl = json.loads((d / "hl.json").read_text())
    (d / "hl_string_epsilon.json").write_text(_resigned(hl, epsilon="4"))
    (d / "hl_tiny_fc.json").write_text(_resigned(hl, f_c=1e-300))
    (d / "hl_huge_epsilon.json").write_text(_resigned(hl, epsilon=1e308))
    (d / "ledger_list.json").write_text("[]")
    (d / "ledger_empty.json").write_text("")
    return d


SENTINEL = b"an earlier output that a refused command must leave alone\n"
_OUT = re.compile(r"\{out:([^}]+)\}")
_DIR = re.compile(r"\{dir:([^}]+)\}")


def _prepare(args: tuple[str, ...], d: Path, tmp: Path) -> tuple[list[str], dict[Path, bytes]]:
    """Expand ``{d}``, ``{out:NAME}`` (a file made first) and ``{dir:NAME}`` (a directory holding a file)."""
    before: dict[Path, bytes] = {}
    argv = []
    for a in args:
        a = a.replace("{d}", str(d))
        if m := _OUT.fullmatch(a):
            path = tmp / m.group(1)
            path.write_bytes(SENTINEL + m.group(1).encode())
            before[path] = path.read_bytes()
            a = str(path)
        elif m := _DIR.fullmatch(a):
            path = tmp / m.group(1)
            path.mkdir()
            (path / "trials.csv").write_bytes(SENTINEL)
            before[path / "trials.csv"] = SENTINEL
            a = str(path)
        argv.append(a)
    return argv, before


def _check_refused(result, needles: tuple[str, ...], absent: tuple[str, ...] = ()) -> str:
    """Exit 2, exactly one `error:` line naming every needle, no traceback; returns that line."""
    text = result.stderr
    assert result.exit_code == 2, (result.exit_code, result.output, text)
    assert "Traceback" not in text and "Traceback" not in result.output, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    for word in absent:
        assert word not in errors[0], (word, errors[0])
    return errors[0]


def _check_unchanged(before: dict[Path, bytes]) -> None:
    for path, data in before.items():
        assert path.read_bytes() == data, f"{path} was changed by a refused command"
        if path.name == "trials.csv":  # an output directory: nothing was added to it either
            assert sorted(p.name for p in path.parent.iterdir()) == ["trials.csv"]


RUN = ("run", "--input", "{d}/log.tsv")
MEAN_EST = ("mean", "estimate", "--input", "{d}/values.csv", "--column", "v", "--lower", "0", "--upper", "10",
            "--optin-fraction", "0.1")
MEAN_SIM = ("mean", "simulate", "--n", "1000", "--optin-fraction", "0.05")
TUNE = ("tune", "--optin-fraction", "0.05")
EPS_835 = f"{LN_MAX / 0.85:.2f}"  # the largest ε with e^(f_C·ε) finite at f_C = 0.85, m_C = 1

# (id, arguments, needles that the one error line must contain[, words it must not contain])
CASES: list[tuple] = [
    # ----- negative / out-of-range seeds, on every command that takes one -----------------------------------------
    ("run-seed", (*RUN, "--seed", "-1", "--output", "{out:res.json}"), ("seed (--seed) = -1", "2^63")),
    ("run-seed-huge", (*RUN, "--seed", str(2**63)), ("seed (--seed) = 9223372036854775808", "9223372036854775807")),
    ("demo-seed", ("demo", "--scale", "0.01", "--seed", "-5"), ("seed (--seed) = -5",)),
    ("headlist-seed", ("headlist", "--input", "{d}/log.tsv", "--seed", "-1", "--out-headlist", "{out:hl.json}",
                       "--out-estimates", "{out:est.json}"), ("seed (--seed) = -1",)),
    ("randomize-seed", ("randomize", "--headlist", "{d}/hl.json", "--input", "{d}/log.tsv", "--seed", "-2",
                        "--output", "{out:r.jsonl}"), ("seed (--seed) = -2",)),
    ("audit-seed", ("audit", "--mechanism", "localalg", "--trials", "1000", "--seed", "-1"), ("seed (--seed) = -1",)),
    ("tune-seed", (*TUNE, "-N", "10000", "--epsilon", "4", "--seed", "-3"), ("seed (--seed) = -3",)),
    ("mean-estimate-seed", (*MEAN_EST, "--epsilon", "1", "--seed", "-1"), ("seed (--seed) = -1",)),
    ("mean-simulate-seed", (*MEAN_SIM, "--epsilon", "1", "--seed", "-1"), ("seed (--seed) = -1",)),
    ("experiment-seed", ("experiment", "fig9", "--dataset", "aol", "--seed", "-1", "--out", "{dir:exp}"),
     ("seed (--seed) = -1",)),
    ("synth-seed", ("synth", "--scale", "0.01", "--seed", "-1", "--output", "{out:s.parquet}"),
     ("seed (--seed) = -1",)),
    # ----- ε so large that an exp() of it overflows: refused up front with the largest value that works -------
    ("run-eps-840", (*RUN, "--epsilon", "840"), ("epsilon (--epsilon) = 840.0", EPS_835, "f_c = 0.85")),
    ("run-eps-1e308", (*RUN, "--epsilon", "1e308", "--output", "{out:res.csv}"),
     ("epsilon (--epsilon) = 1e+308", EPS_835)),
    ("run-eps-mc3", (*RUN, "--epsilon", "1500", "--m-c", "3"), ("epsilon (--epsilon) = 1500.0", f"{2 * LN_MAX:.2f}")),
    ("run-eps-no-urls", ("run", "--input", "{d}/log.csv", "--user-col", "uid", "--query-col", "q", "--epsilon", "750"),
     ("epsilon (--epsilon) = 750.0", f"{LN_MAX:.2f}", "no URL level")),
    ("run-eps-local-only", (*RUN, "--algorithm", "local-only", "--epsilon", "30"),
     ("epsilon (--epsilon) = 30.0", f"{math.log(2**31 - 2):.4f}", "2^31")),
    ("demo-eps", ("demo", "--scale", "0.01", "--epsilon", "1e308"), ("epsilon (--epsilon) = 1e+308", EPS_835)),
    ("headlist-eps", ("headlist", "--input", "{d}/log.tsv", "--epsilon", "1e308", "--out-headlist", "{out:hl.json}",
                      "--out-estimates", "{out:est.json}"), ("epsilon (--epsilon) = 1e+308", EPS_835)),
    ("audit-localalg-eps", ("audit", "--mechanism", "localalg", "--epsilon", "1e308", "--trials", "1000"),
     ("epsilon (--epsilon) = 1e+308", f"{LN_MAX:.2f}")),
    ("audit-headlist-eps", ("audit", "--mechanism", "headlist", "--epsilon", "1e308", "--trials", "1000"),
     ("epsilon (--epsilon) = 1e+308", f"{LN_MAX:.2f}")),
    ("audit-optin-eps", ("audit", "--mechanism", "optin-estimate", "--epsilon", "710", "--trials", "1000"),
     ("epsilon (--epsilon) = 710.0", f"{LN_MAX:.2f}")),
    ("tune-eps", (*TUNE, "-N", "10000", "--epsilon", "1e308"), ("epsilon (--epsilon) = 1e+308", f"{LN_MAX - 1:.2f}")),
    # mean: the noise's standard deviation must stay a double whose square is finite and non-zero
    ("mean-estimate-eps-tiny", (*MEAN_EST, "--epsilon", "1e-300"), ("epsilon (--epsilon) = 1e-300", "n_T = 20")),
    ("mean-estimate-eps-huge", (*MEAN_EST, "--epsilon", "1e308", "--json"), ("epsilon (--epsilon) = 1e+308",)),
    ("mean-simulate-eps-tiny", (*MEAN_SIM, "--epsilon", "1e-300"), ("epsilon (--epsilon) = 1e-300", "n_T = 50")),
    ("mean-simulate-eps-huge", (*MEAN_SIM, "--epsilon", "1e300", "--json"), ("epsilon (--epsilon) = 1e+300",)),
    ("mean-plot-eps", ("mean", "plot", "--epsilon", "1e-300", "--optin-fraction", "0.05", "--out", "{dir:plots}"),
     ("epsilon (--epsilon) = 1e-300",)),
    # ----- f_C so close to 0 or 1 that LocalAlg's estimator would divide by rounding error ----------------------
    ("run-fc-tiny", (*RUN, "--f-c", "1e-300", "--output", "{out:res.parquet}"), ("f_c (--f-c) = 1e-300", "0.85")),
    ("run-fc-tiny-json", (*RUN, "--f-c", "1e-300", "--json"), ("f_c (--f-c) = 1e-300",)),
    ("run-fc-near-one", (*RUN, "--f-c", "0.9999999999999999"), ("f_c (--f-c) = 0.9999999999999999",)),
    ("audit-fc-tiny", ("audit", "--mechanism", "localalg", "--f-c", "1e-300", "--trials", "1000", "--json"),
     ("f_c (--f-c) = 1e-300",)),
    ("headlist-fc-tiny", ("headlist", "--input", "{d}/log.tsv", "--f-c", "1e-300", "--out-headlist", "{out:hl.json}",
                          "--out-estimates", "{out:est.json}"), ("f_c (--f-c) = 1e-300",)),
    # ----- δ that underflows, records per user that make sampling explode ------------------------------------------
    ("run-delta-subnormal", (*RUN, "--delta", "5e-324"), ("delta (--delta) = 5e-324", "1e-300")),
    ("run-mc-huge", (*RUN, "--m-c", "1000"), ("m_c (--m-c) = 1000", "at most 100")),
    ("run-mo-huge", (*RUN, "--m-o", "101"), ("m_o (--m-o) = 101", "at most 100")),
    ("headlist-mo-huge", ("headlist", "--input", "{d}/log.tsv", "--m-o", "1000000000", "--out-headlist",
                          "{out:hl.json}", "--out-estimates", "{out:est.json}"), ("m_o (--m-o) = 1000000000",)),
    # ----- absurd trial counts and sizes: refused with the stated maximum --------------------------------------
    ("audit-trials-huge", ("audit", "--mechanism", "headlist", "--trials", str(10**10)),
     ("trials (--trials) = 10000000000", "1,000,000,000")),
    ("audit-trials-zero", ("audit", "--mechanism", "localalg", "--trials", "0"), ("trials (--trials) = 0",)),
    ("mean-simulate-trials-huge", (*MEAN_SIM, "--epsilon", "1", "--trials", str(10**10)),
     ("trials (--trials) = 10000000000", "1,000,000,000")),
    ("mean-simulate-values-huge", ("mean", "simulate", "--n", "1000000", "--optin-fraction", "0.05", "--epsilon", "1",
                                   "--distribution", "beta:2,2", "--trials", "100000000"),
     ("trials (--trials) = 100000000", "at most 100,000")),
    ("mean-simulate-n-huge", ("mean", "simulate", "--n", str(10**13), "--optin-fraction", "0.05", "--epsilon", "1"),
     ("n (--n) = 10000000000000", "1e+12")),
    ("tune-trials", (*TUNE, "-N", "10000", "--epsilon", "4", "--trials", "101"), ("trials (--trials) = 101", "100")),
    ("tune-trials-memory", (*TUNE, "-N", "10000000", "--epsilon", "4", "--trials", "10"),
     ("trials (--trials) = 10", "at most 5")),
    ("tune-population-huge", (*TUNE, "-N", "100000000", "--epsilon", "4"),
     ("population (--population) = 100000000", "25,000,000")),
    ("tune-population-small", (*TUNE, "-N", "999", "--epsilon", "4"), ("population (--population) = 999", "1,000")),
    ("experiment-trials", ("experiment", "fig9", "--dataset", "aol", "--trials", "1000", "--out", "{dir:exp}"),
     ("trials (--trials) = 1000", "1 to 100")),
    ("experiment-jobs", ("experiment", "fig9", "--dataset", "aol", "--jobs", "0", "--out", "{dir:exp}"),
     ("jobs (--jobs) = 0",)),
    ("experiment-scale", ("experiment", "fig9", "--dataset", "aol", "--scale", "1000", "--out", "{dir:exp}"),
     ("scale (--scale) = 1000.0", "10")),
    ("demo-scale", ("demo", "--scale", "100"), ("scale (--scale) = 100.0",)),
    ("synth-scale", ("synth", "--scale", "1e6", "--output", "{out:s.parquet}"), ("scale (--scale) = 1000000.0",)),
    ("run-top", (*RUN, "--top", "0"), ("top (--top) = 0",)),
    # ----- hints that must say the right thing ------------------------------------------------------------------
    ("mean-simulate-variance-share-0", (*MEAN_SIM, "--epsilon", "1", "--variance-share", "0"),
     ("variance_share (--variance-share) = 0.0", "opt-in budget"), ("5%",)),
    ("mean-estimate-variance-share-0", (*MEAN_EST, "--epsilon", "1", "--variance-share", "0"),
     ("variance_share (--variance-share) = 0.0",), ("5%",)),
    ("mean-simulate-variance-share-tiny", (*MEAN_SIM, "--epsilon", "1", "--variance-share", "1e-300"),
     ("variance_share (--variance-share) = 1e-300", "1 - ")),
    ("mean-simulate-range-huge", (*MEAN_SIM, "--epsilon", "1", "--lower", "-1e200", "--upper", "1e200"),
     ("lower (--lower) = -1e+200",)),
    ("mean-plot-n-max", ("mean", "plot", "--epsilon", "1", "--optin-fraction", "0.05", "--n-max", "1e300",
                         "--out", "{dir:plots}"), ("--n-max = 1e+300",)),
    ("mean-plot-sigma2", ("mean", "plot", "--epsilon", "1", "--optin-fraction", "0.05", "--sigma2", "5",
                          "--out", "{dir:plots}"), ("sigma2 (--sigma2) = 5.0", "0.25")),
    ("mean-plot-compare-fractions", ("mean", "plot", "--epsilon", "1", "--optin-fraction", "0.05",
                                     "--compare-fractions", "0.5,2", "--out", "{dir:plots}"),
     ("--compare-fractions = '0.5,2'", "2 is not"), ("--optin-fraction",)),
    ("mean-plot-compare-fraction-tiny", ("mean", "plot", "--epsilon", "1", "--optin-fraction", "0.05",
                                         "--compare-fractions", "1e-300", "--out", "{dir:plots}"),
     ("--compare-fractions = 1e-300", "no epsilon")),
    ("mean-plot-n-min", ("mean", "plot", "--epsilon", "1", "--optin-fraction", "0.05", "--n-min", "1e-300",
                         "--out", "{dir:plots}"), ("--n-min = 1e-300", "from 1")),
    ("privacy-delta-prime", ("privacy", "report", "{d}/ledger.db", "--delta-prime", "2"),
     ("delta_prime (--delta-prime) = 2.0",)),
    ("run-ledger-baseline", (*RUN, "--algorithm", "optin-only", "--ledger", "{out:led.db}"), ("--ledger", "blender")),
    # ----- too few users for the hybrid model: say what would work ----------------------------------------------
    ("run-too-few-users", ("run", "--input", "{d}/small.tsv", "--output", "{out:res.json}"),
     ("130 users", "6 opt-in users", "0 in T", "--optin-fraction", "at least", "--row-per-user")),
    ("run-central-no-t", ("run", "--input", "{d}/small.tsv", "--algorithm", "central", "--f-o", "0.999"),
     ("0 in T", "smaller --f-o")),
    # ----- an unwritable output is refused before the input is even read ----------------------------------------
    ("run-output-missing-dir", ("run", "--input", "{d}/no-such-log.tsv", "--output", "/missing/dir/x.json"),
     ("--output", "/missing/dir")),
]

SEAM_CASES: list[tuple] = [
    # ----- SEAM: the file workflow (headlist → randomize → estimate), fixed by the seam owner -----------------
    ("seam-binary-csv", ("headlist", "--input", "{d}/bin.csv", "--out-headlist", "{out:hl.json}", "--out-estimates",
                         "{out:est.json}"), ("bin.csv", "text")),
    ("seam-binary-csv-run", ("run", "--input", "{d}/bin.csv", "--user-col", "uid"), ("bin.csv",)),
    ("seam-binary-reports", ("estimate", "--headlist", "{d}/hl.json", "--optin-estimates", "{d}/est.json",
                             "--reports", "{d}/bin.jsonl", "--output", "{out:res.json}"), ("bin.jsonl", "UTF-8")),
    ("seam-latin1-reports", ("estimate", "--headlist", "{d}/hl.json", "--optin-estimates", "{d}/est.json",
                             "--reports", "{d}/latin1.jsonl"), ("latin1.jsonl", "UTF-8")),
    ("seam-truncated-gz", ("estimate", "--headlist", "{d}/hl.json", "--optin-estimates", "{d}/est.json",
                           "--reports", "{d}/truncated.jsonl.gz"), ("truncated.jsonl.gz", "truncated")),
    ("seam-too-many-reports", ("estimate", "--headlist", "{d}/hl.json", "--optin-estimates", "{d}/est.json",
                               "--reports", "{d}/too_many.jsonl"), ("too_many.jsonl", "m_C")),
    ("seam-estimates-n-zero", ("estimate", "--headlist", "{d}/hl.json", "--optin-estimates", "{d}/est_n_zero.json",
                               "--reports", "{d}/rep.jsonl"), ("est_n_zero.json", "'n'")),
    ("seam-estimates-n-negative", ("estimate", "--headlist", "{d}/hl.json", "--optin-estimates",
                                   "{d}/est_n_negative.json", "--reports", "{d}/rep.jsonl"), ("'n'", "-5")),
    ("seam-estimates-variance-negative", ("estimate", "--headlist", "{d}/hl.json", "--optin-estimates",
                                          "{d}/est_variance_negative.json", "--reports", "{d}/rep.jsonl"),
     ("noise_variance", "-1.0")),
    ("seam-estimates-null", ("estimate", "--headlist", "{d}/hl.json", "--optin-estimates", "{d}/est_null.json",
                             "--reports", "{d}/rep.jsonl"), ("p_record",)),
    ("seam-estimates-nan", ("estimate", "--headlist", "{d}/hl.json", "--optin-estimates", "{d}/est_nan.json",
                            "--reports", "{d}/rep.jsonl"), ("p_record",)),
    ("seam-device-ledger-list", ("randomize", "--headlist", "{d}/hl.json", "--input", "{d}/log.tsv", "--single-device",
                                 "--device-ledger", "{d}/ledger_list.json", "--lifetime-epsilon", "100",
                                 "--lifetime-delta", "0.01", "--output", "{out:r.jsonl}"), ("ledger_list.json",)),
    ("seam-device-ledger-empty", ("randomize", "--headlist", "{d}/hl.json", "--input", "{d}/log.tsv",
                                  "--single-device", "--device-ledger", "{d}/ledger_empty.json", "--lifetime-epsilon",
                                  "100", "--lifetime-delta", "0.01", "--output", "{out:r.jsonl}"),
     ("ledger_empty.json", "empty")),
    ("seam-headlist-string-eps-randomize", ("randomize", "--headlist", "{d}/hl_string_epsilon.json", "--input",
                                            "{d}/log.tsv", "--output", "{out:r.jsonl}"), ("'epsilon'", "'4'")),
    ("seam-headlist-string-eps-estimate", ("estimate", "--headlist", "{d}/hl_string_epsilon.json", "--optin-estimates",
                                           "{d}/est.json", "--reports", "{d}/rep.jsonl"), ("'epsilon'", "'4'")),
    ("seam-headlist-huge-eps-randomize", ("randomize", "--headlist", "{d}/hl_huge_epsilon.json", "--input",
                                          "{d}/log.tsv", "--output", "{out:r.jsonl}"), ("'epsilon'", "1e+308")),
    ("seam-headlist-tiny-fc-randomize", ("randomize", "--headlist", "{d}/hl_tiny_fc.json", "--input",
                                         "{d}/log.tsv", "--output", "{out:r.jsonl}"), ("hl_tiny_fc.json", "f_c")),
    ("seam-headlist-tiny-fc-estimate", ("estimate", "--headlist", "{d}/hl_tiny_fc.json", "--optin-estimates",
                                        "{d}/est.json", "--reports", "{d}/rep.jsonl"), ("hl_tiny_fc.json", "f_c")),
    # ----- Click's own usage errors are one line too ---------------------------------------------------------------
    ("usage-not-a-number", (*RUN, "--epsilon", "abc", "--output", "{out:res.json}"),
     ("'--epsilon'", "'abc'", "--help")),
    ("usage-unknown-option", ("estimate", "--bogus", "1"), ("--bogus",)),
    ("usage-missing-option", ("estimate", "--headlist", "{d}/hl.json"), ("--optin-estimates",)),
    ("usage-unknown-command", ("estimat",), ("estimat",)),
    ("seam-headlist-huge-eps-estimate", ("estimate", "--headlist", "{d}/hl_huge_epsilon.json", "--optin-estimates",
                                         "{d}/est.json", "--reports", "{d}/rep.jsonl"), ("'epsilon'", "1e+308")),
]


def _params(cases: list[tuple]) -> list:
    return [pytest.param(args, needles, absent[0] if absent else (), id=name) for name, args, needles, *absent in cases]


@pytest.mark.parametrize(("args", "needles", "absent"), _params(CASES))
def test_bad_parameter_is_one_error_line(d: Path, tmp_path: Path, args, needles, absent) -> None:
    argv, before = _prepare(args, d, tmp_path)
    _check_refused(invoke(*argv, ok=False), needles, absent)
    _check_unchanged(before)


def test_case_counts() -> None:
    assert len(CASES) >= 60 and len(CASES) + len(SEAM_CASES) >= 75
    assert len({c[0] for c in CASES + SEAM_CASES}) == len(CASES) + len(SEAM_CASES)


def test_run_reads_synth_parquet_without_flags(tmp_path: Path) -> None:
    """`synth` writes columns user, query, url; `run` reads them with no --user-col / --url-col."""
    out = tmp_path / "s.parquet"
    invoke("synth", "--scale", "0.01", "--seed", "1", "--output", out)
    obj = json.loads(invoke("run", "--input", out, "--optin-fraction", "0.4", "--head-list-size", "10", "--seed",
                            "1", "--json").stdout)
    assert obj["sizes"]["users"] == 5194 and obj["head_list_records"] >= 1  # the user column: 5,194 users
    urls = [r["url"] for r in obj["records"] if not r["wildcard"]]
    assert urls and all(u.startswith("http") for u in urls)  # the url column: records are (query, URL) pairs


def test_delta_warning_names_one_over_n(d: Path) -> None:
    r = invoke("run", "--input", d / "log.tsv", "--optin-fraction", "0.3", "--head-list-size", "10", "--seed", "1",
               "--delta", "0.01", "--json")
    assert "1/number-of-users = 0.000333" in r.stderr  # n = 3000 users
    assert json.loads(r.stdout)["delta"] == 0.01


def test_tune_warns_about_delta() -> None:
    r = invoke(*TUNE, "-N", "1000", "--epsilon", "4", "--delta", "0.01", "--trials", "2", "--seed", "1", ok=False)
    assert "1/number-of-users = 0.001" in r.stderr


def _interrupt(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("target,args", [
    ("hybriddp.cli.audit.audit", ("audit", "--mechanism", "localalg", "--trials", "1000")),
    ("hybriddp.cli.mean.simulate", (*MEAN_SIM, "--epsilon", "1")),
    ("hybriddp.cli.tune.tune", (*TUNE, "-N", "10000", "--epsilon", "4")),
    ("hybriddp.cli.run.run_blender", (*RUN, "--optin-fraction", "0.3", "--output", "{out:res.json}")),
])
def test_ctrl_c_is_one_line_exit_130(monkeypatch, d: Path, tmp_path: Path, target: str, args) -> None:
    """KeyboardInterrupt inside a long loop: 'interrupted', exit 130, no traceback, outputs unchanged."""
    monkeypatch.setattr(target, _interrupt)
    argv, before = _prepare(args, d, tmp_path)
    r = invoke(*argv, ok=False)
    assert r.exit_code == 130 and r.stderr.strip().splitlines()[-1] == "interrupted", r.stderr
    assert "Traceback" not in r.stderr
    _check_unchanged(before)


def test_ctrl_c_stops_a_real_audit() -> None:
    """A real SIGINT to a long audit (10⁹ trials): one line, exit 130, within seconds."""
    p = subprocess.Popen([sys.executable, "-m", "hybriddp", "audit", "--mechanism", "headlist", "--trials",
                          str(10**9)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4.0)  # imports (~1 s) and into the trial loop
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "interrupted\n", err
    assert out == ""


def test_audit_shows_progress_on_a_terminal(monkeypatch) -> None:
    import io

    from rich.console import Console

    from hybriddp.cli import render

    buf = io.StringIO()
    monkeypatch.setattr(render, "err", Console(file=buf, force_terminal=True, width=100))
    invoke("audit", "--mechanism", "localalg", "--trials", "3000000", "--seed", "1")
    assert "auditing localalg" in buf.getvalue() and "3000000" in buf.getvalue()


# ----- SEAM: acceptance of the file workflow (may fail until the seam owner's changes land) ------------------
@pytest.mark.parametrize(("args", "needles", "absent"), _params(SEAM_CASES))
def test_seam_bad_file_is_one_error_line(d: Path, tmp_path: Path, args, needles, absent) -> None:
    argv, before = _prepare(args, d, tmp_path)
    _check_refused(invoke(*argv, ok=False), needles, absent)
    _check_unchanged(before)


def test_seam_duplicated_message_counted_once(d: Path) -> None:
    """A device message resent with the same id is counted once: the estimates equal the original file's."""
    base = ("estimate", "--headlist", d / "hl.json", "--optin-estimates", d / "est.json", "--json", "--reports")
    once = json.loads(invoke(*base, d / "rep.jsonl").stdout)
    twice = json.loads(invoke(*base, d / "duplicated.jsonl").stdout)
    assert twice["sizes"]["reports"] == once["sizes"]["reports"]
    assert twice["sizes"].get("duplicate_messages") == 1
    assert twice["ndcg"] == once["ndcg"] and twice["l1"] == once["l1"]
    assert [r["p_blended"] for r in twice["figure9"]] == [r["p_blended"] for r in once["figure9"]]


def test_seam_refused_randomize_leaves_reports_unchanged(d: Path, tmp_path: Path) -> None:
    """The device ledger refuses a second report for the same head list; the earlier reports file stays."""
    ledger, out = tmp_path / "device.json", tmp_path / "reports.jsonl"
    args = ("randomize", "--headlist", d / "hl.json", "--input", d / "log.tsv", "--single-device", "--device-ledger",
            ledger, "--output", out)
    invoke(*args, "--lifetime-epsilon", "100", "--lifetime-delta", "0.01")
    before, ledger_before = out.read_bytes(), ledger.read_bytes()
    _check_refused(invoke(*args, ok=False), ("already reported",))
    assert out.read_bytes() == before and ledger.read_bytes() == ledger_before


def test_seam_headlist_bad_estimates_path_charges_nothing(d: Path, tmp_path: Path) -> None:
    """An unwritable --out-estimates: no head list written, the privacy ledger not charged."""
    ledger = tmp_path / "ledger.db"
    ledger.write_bytes((d / "ledger.db").read_bytes())  # a ledger that already holds one round
    hl = tmp_path / "hl.json"
    hl.write_bytes(SENTINEL)
    r = invoke("headlist", "--input", d / "log.tsv", "--optin-fraction", "0.3", "--head-list-size", "20",
               "--out-headlist", hl, "--out-estimates", tmp_path / "missing" / "est.json", "--ledger", ledger,
               ok=False)
    _check_refused(r, ("--out-estimates",))
    assert hl.read_bytes() == SENTINEL
    assert ledger.read_bytes() == (d / "ledger.db").read_bytes()
    report = json.loads(invoke("privacy", "report", ledger, "--json").stdout)
    assert len(report["rounds"]) == 1
