"""``hybriddp mean estimate | simulate | plot`` (ALGORITHM.md §11): output, JSON, files, one-line errors."""

from __future__ import annotations

import gzip
import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clihelpers import assert_clean_error as _assert_clean_error
from clihelpers import invoke
from hybriddp import mean as hm

EST = ("--lower", "0", "--upper", "10", "--epsilon", "1", "--optin-fraction", "0.1", "--seed", "3")


def assert_clean_error(result, *needles: str) -> None:
    _assert_clean_error(result, *needles)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("mean")
    x = np.round(np.random.default_rng(0).gamma(2.0, 1.5, 3000), 3)
    x[:3] = [-1.0, 11.0, 25.0]  # clamped, with the gamma tail above 10
    lines = ["user,minutes,country"] + [f"u{i},{v},DE" for i, v in enumerate(x)]
    (d / "s.csv").write_text("\n".join(lines) + "\n")
    with gzip.open(d / "s.tsv.gz", "wt") as f:
        f.write("\n".join(line.replace(",", "\t") for line in lines) + "\n")
    pq.write_table(pa.table({"minutes": x, "label": ["a"] * len(x)}), d / "s.parquet")
    return d, x


def test_estimate_prints_three_estimates_true_mean_and_rmse(data) -> None:
    d, x = data
    r = invoke("mean", "estimate", "--input", d / "s.csv", "--column", "minutes", *EST)
    below, above = int((x < 0).sum()), int((x > 10).sum())
    assert below == 1 and above > 2
    for needle in ("FullLM", "OnlyTCM", "Hybrid, w* with oracle σ²", "Hybrid, private σ̂²", "analytic RMSE",
                   f"true sample mean {x.mean():.6g}", f"{below + above} values clamped: 1 below, {above} above",
                   "privacy"):
        assert needle in r.stdout, r.stdout
    assert "experiments only" in r.stderr  # seeded


def test_estimate_json_same_for_csv_tsv_parquet(data) -> None:
    d, x = data
    objs = [json.loads(invoke("mean", "estimate", "--input", d / name, "--column", "minutes", *EST, "--json").stdout)
            for name in ("s.csv", "s.tsv.gz", "s.parquet")]
    obj = objs[0]
    assert obj["n"] == 3000 and obj["n_optin"] == 300 and obj["n_local"] == 2700
    assert obj["true_mean"] == pytest.approx(x.mean())
    above = int((x > 10).sum())
    assert obj["clamped"] == {"below": 1, "above": above, "total": 1 + above}
    est = obj["estimates"]
    assert set(est) == {"full_lm", "only_tcm", "hybrid_oracle", "hybrid_unknown_variance"}
    s2 = float(np.var(np.clip(x, 0, 10), ddof=1))
    assert est["full_lm"]["rmse"] == pytest.approx((2 * 100 / 3000) ** 0.5)
    assert est["only_tcm"]["expected_squared_error"] == pytest.approx(
        hm.mse_only_tcm(3000, 0.1, epsilon=1.0, sigma2=s2, width=10.0))
    assert est["hybrid_oracle"]["weight"] == pytest.approx(hm.optimal_weight(3000, 0.1, epsilon=1.0, sigma2=s2,
                                                                             width=10.0))
    assert 0 <= est["hybrid_unknown_variance"]["private_sigma2"] <= 25
    for other in objs[1:]:
        assert other["estimates"] == obj["estimates"]  # same values, same seed: same draws


def test_estimate_bad_input(tmp_path, data) -> None:
    d, _ = data
    assert_clean_error(invoke("mean", "estimate", "--input", d / "s.csv", "--column", "minute", *EST, ok=False),
                       "s.csv", "no column 'minute'", "'minutes'", "--column")
    bad = tmp_path / "bad.csv"
    bad.write_text("user,minutes\nu1,3.5\n\nu2,4\nu3,abc\n")
    assert_clean_error(invoke("mean", "estimate", "--input", bad, "--column", "minutes", *EST, ok=False),
                       "bad.csv", "line 5", "column 'minutes'", "'abc'", "not a number")
    empty = tmp_path / "empty.csv"
    empty.write_text("user,minutes\nu1,3.5\nu2,\n")
    assert_clean_error(invoke("mean", "estimate", "--input", empty, "--column", "minutes", *EST, ok=False),
                       "empty.csv", "line 3", "is empty")
    nan = tmp_path / "nan.csv"
    nan.write_text("minutes\n1\nnan\n")
    assert_clean_error(invoke("mean", "estimate", "--input", nan, "--column", "minutes", *EST, ok=False),
                       "line 3", "'nan'")
    pq.write_table(pa.table({"minutes": pa.array([1.0, None, 2.0])}), tmp_path / "null.parquet")
    assert_clean_error(invoke("mean", "estimate", "--input", tmp_path / "null.parquet", "--column", "minutes", *EST,
                              ok=False), "null.parquet", "row 2", "column 'minutes'")
    pq.write_table(pa.table({"minutes": ["1", "x"]}), tmp_path / "str.parquet")
    assert_clean_error(invoke("mean", "estimate", "--input", tmp_path / "str.parquet", "--column", "minutes", *EST,
                              ok=False), "row 2", "'x'")
    assert_clean_error(invoke("mean", "estimate", "--input", tmp_path / "none.csv", "--column", "x", *EST, ok=False),
                       "not found", "none.csv")
    small = tmp_path / "small.csv"
    small.write_text("minutes\n1\n2\n3\n")
    assert_clean_error(invoke("mean", "estimate", "--input", small, "--column", "minutes", *EST, ok=False),
                       "3 users", "0 opt-in", "both groups must be non-empty")


@pytest.mark.parametrize("args,needles", [
    (("--lower", "1", "--upper", "1"), ["upper (--upper) = 1.0", "> lower = 1.0"]),
    (("--epsilon", "0"), ["epsilon (--epsilon) = 0.0", "> 0"]),
    (("--optin-fraction", "1"), ["optin_fraction (--optin-fraction) = 1.0", "strictly between 0 and 1"]),
    (("--n", "10", "--optin-fraction", "0.05"), ["n (--n) = 10", ">= 11"]),
    (("--distribution", "poisson"), ["distribution (--distribution) = 'poisson'"]),
    (("--trials", "1"), ["trials (--trials) = 1", "from 2 to 1,000,000,000"]),
])
def test_simulate_bad_parameters(args: tuple[str, ...], needles: list[str]) -> None:
    base = {"--n": "100", "--optin-fraction": "0.1", "--epsilon": "1"}
    argv = list(args)
    for k, v in base.items():
        if k not in argv:
            argv += [k, v]
    assert_clean_error(invoke("mean", "simulate", *argv, ok=False), *needles)


def test_simulate_json_keys_and_values() -> None:
    r = invoke("mean", "simulate", "--n", "2000", "--optin-fraction", "0.05", "--epsilon", "1", "--trials", "20000",
               "--seed", "1", "--json")
    obj = json.loads(r.stdout)
    for key in ("mse_full_lm", "mse_only_tcm", "mse_hybrid"):
        assert {"analytic", "simulated", "simulated_se"} <= set(obj[key])
        assert abs(obj[key]["simulated"] - obj[key]["analytic"]) <= 5 * obj[key]["simulated_se"]
    assert obj["mse_hybrid"]["analytic"] == pytest.approx(4.903e-4, abs=5e-8)
    assert obj["w_star"] == pytest.approx(0.5148, abs=1e-4)
    assert obj["r"] == pytest.approx(2.02, abs=0.01)
    assert obj["mse_hybrid_unknown_variance"]["variance_share"] == 0.2
    assert obj["seed"] == 1 and "warning" in obj


def test_simulate_human_output() -> None:
    r = invoke("mean", "simulate", "--n", "500", "--optin-fraction", "0.2", "--epsilon", "2", "--distribution",
               "beta:2,5", "--lower", "-1", "--upper", "1", "--trials", "2000")
    for needle in ("FullLM", "OnlyTCM", "Hybrid (w* =", "analytic MSE", "simulated MSE", "w* =", "R = min(MSE_F"):
        assert needle in r.stdout, r.stdout


def test_simulate_large_is_fast() -> None:
    """Acceptance: --n 10000 --trials 100000 finishes in seconds (measured ~1 s on the 2-core box)."""
    t = time.perf_counter()
    obj = json.loads(invoke("mean", "simulate", "--n", "10000", "--optin-fraction", "0.05", "--epsilon", "1",
                            "--trials", "100000", "--json").stdout)
    assert time.perf_counter() - t < 20
    assert obj["trials"] == 100_000 and "seed" in obj and obj["seed"] is None and "warning" not in obj


def test_plot_writes_both_figures(tmp_path) -> None:
    r = invoke("mean", "plot", "--epsilon", "1", "--optin-fraction", "0.05", "--out", tmp_path / "figs", "--json")
    obj = json.loads(r.stdout)
    for path in (obj["figure1"]["path"], obj["figure2"]["path"]):
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert obj["figure1"]["r_max"] == pytest.approx(2.03, abs=0.005)
    assert 1850 <= obj["figure1"]["n_at_r_max"] <= 1950
    peak = next(p for p in obj["figure2"]["peaks"] if p["optin_fraction"] == 0.05)
    assert peak["interior"] and peak["r_max"] == pytest.approx(2.03, abs=0.005)
    r = invoke("mean", "plot", "--epsilon", "1", "--optin-fraction", "0.05", "--out", tmp_path / "figs")
    out = " ".join(r.stdout.split())  # the console may wrap a long path line anywhere
    assert "Fig. 1" in out and "Fig. 2" in out


def test_plot_bad_parameters(tmp_path) -> None:
    assert_clean_error(invoke("mean", "plot", "--epsilon", "1", "--optin-fraction", "0.05", "--compare-fractions",
                              "0.1,x", "--out", tmp_path, ok=False), "--compare-fractions")
    assert_clean_error(invoke("mean", "plot", "--epsilon", "-1", "--optin-fraction", "0.05", "--out", tmp_path,
                              ok=False), "epsilon (--epsilon) = -1.0")
