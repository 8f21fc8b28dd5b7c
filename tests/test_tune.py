"""`hybriddp tune`: the law fit, the search, the privacy boundary (DP files only) and the CLI."""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hybriddp import tune as T
from hybriddp.cli import cli
from hybriddp.core.noise import DiscreteLaplaceNoise
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog, SampledRecords, SyntheticVocabulary
from hybriddp.curator.party import curate
from hybriddp.io.exchange import write_release_files
from hybriddp.simulation.pipeline import run_blender, split_optin
from hybriddp.simulation.scoring import Truth, generalized_ndcg


def law_log(n_users: int, law: T.RankFrequencyLaw, n_ranks: int, urls_per_query: int, seed: int) -> RecordLog:
    """One record per user: rank r with probability law(r) (ranks grouped into queries), rest singletons."""
    p = law.density(np.arange(1, n_ranks + 1))
    assert p.sum() < 1
    rng = np.random.default_rng(seed)
    cat = np.searchsorted(np.cumsum(p), rng.random(n_users), side="right")
    tail = cat >= n_ranks
    query = np.where(tail, n_ranks + np.arange(n_users), cat // urls_per_query)
    url = np.where(tail, n_ranks + np.arange(n_users), cat)
    size = n_ranks + n_users
    return RecordLog(np.arange(n_users + 1), query.astype(np.int32), url.astype(np.int32),
                     SyntheticVocabulary(size, "query "), SyntheticVocabulary(size, "http://u"))


def write_curator_files(log: RecordLog, params: BlenderParams, directory: Path, seed: int) -> tuple[Path, Path]:
    """What `hybriddp headlist --optin-fraction c --seed s` writes: the DP head list and estimates."""
    optin, _ = split_optin(log.n_users, params.optin_fraction, seed)
    rel, _ = curate(log, params, optin_users=optin, seed=seed, noise_factory=DiscreteLaplaceNoise, with_charges=False)
    hl_path, est_path = directory / "headlist.json", directory / "optin-estimates.json"
    write_release_files(hl_path, est_path, rel.headlist, rel.estimates)
    return hl_path, est_path


TRUE_LAW = T.RankFrequencyLaw(0.03, 0.9, 1.6, 40)


@pytest.fixture(scope="module")
def big_files(tmp_path_factory):
    """A large opt-in group (|D_T| = 10,000) from a known two-piece law, M = 40 = the law's break."""
    d = tmp_path_factory.mktemp("tune_big")
    log = law_log(250_000, TRUE_LAW, 20_000, 2, seed=1)
    params = BlenderParams(optin_fraction=0.4, f_o=0.9, head_list_size=40)
    return write_curator_files(log, params, d, seed=2)


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    """N = 50,000 users, 10% opt-in, the paper's other defaults (M = 50)."""
    d = tmp_path_factory.mktemp("tune_small")
    log = law_log(50_000, T.RankFrequencyLaw(0.03, 1.0, 1.0, 50), 20_000, 3, seed=3)
    return write_curator_files(log, BlenderParams(optin_fraction=0.1), d, seed=4)


def test_fit_recovers_known_power_law(big_files) -> None:
    inputs = T.load_privatized(*big_files)
    obs = T.CuratorObservation.from_inputs(inputs)
    assert obs.n_t == 10_000 and obs.noise == "discrete" and len(obs.counts) == 40
    fit = T.fit_rank_law(obs, seed=0)
    law = fit.law
    assert abs(law.alpha_head - TRUE_LAW.alpha_head) < 0.12, law
    assert abs(law.alpha_tail - TRUE_LAW.alpha_tail) < 0.3, law
    ranks = np.array([1, 5, 20, 40, 80])
    ratio = law.density(ranks) / TRUE_LAW.density(ranks)
    assert np.all(np.abs(ratio - 1) < 0.3), ratio
    assert abs(fit.expected_head_list_s - obs.head_list_s_records) < 0.1 * obs.head_list_s_records


@pytest.mark.parametrize("estimator", ["paper", "reuse"])
def test_fit_less_biased_than_loglog_regression(tmp_path, estimator: str) -> None:
    """A trimmed list (top 30 of ~65) of tiny T-counts: sorting inflates the bottom, so the naive
    log-log regression flattens the slope; the simulated-moments fit corrects for it. A release that
    reuses S (ALGORITHM.md §4.1) lists S ∪ T counts, 20 times as many records, and fits as well."""
    law = T.RankFrequencyLaw(0.02, 1.2, 1.2, 30)
    naive, fitted = [], []
    for seed in range(4):
        d = tmp_path / str(seed)
        d.mkdir()
        log = law_log(300_000, law, 20_000, 2, seed=seed)
        params = BlenderParams(optin_fraction=0.2, f_o=0.95, head_list_size=30, estimator=estimator)
        files = write_curator_files(log, params, d, seed + 10)
        obs = T.CuratorObservation.from_inputs(T.load_privatized(*files))
        assert obs.head_list_s_records > 50 and obs.n_t == 3000
        assert obs.n_counts == (3000 if estimator == "paper" else 3000 + obs.n_s)
        fit = T.fit_rank_law(obs, seed=0)
        naive.append(fit.start[1])
        fitted.append(fit.law.alpha_head)
    assert abs(np.mean(fitted) - 1.2) < 0.1, fitted
    if estimator == "paper":  # with S ∪ T counts (20 times larger) sorting hardly inflates the bottom
        assert abs(np.mean(fitted) - 1.2) < abs(np.mean(naive) - 1.2), (fitted, naive)


def test_model_masses_and_sampling(small_files) -> None:
    inputs = T.load_privatized(*small_files)
    model = T.model_from_inputs(inputs, population=50_000, optin_fraction=0.1, seed=0)
    total = model.record_p.sum() + model.query_tail.sum() + model.singleton_mass
    assert total == pytest.approx(1.0) and model.singleton_mass > 0
    assert model.source == "privatized" and "alpha_head" in model.parameters
    log = model.sample_log(20_000, np.random.default_rng(0))
    assert log.n_users == log.n_records == 20_000 and log.has_urls
    freq = np.bincount(log.url[log.url < len(model.record_p)], minlength=len(model.record_p)) / 20_000
    assert abs(freq[:5] - model.record_p[:5]).max() < 0.01
    prior = T.prior_model()
    assert prior.source == "prior" and 0 < prior.record_p.sum() < 1


def test_tune_api_takes_only_privatized_inputs() -> None:
    """No public function of the tune library accepts raw records: only N, c, ε, δ and the DP files."""
    raw_types = (RecordLog, SampledRecords)
    for name in T.__all__:
        obj = getattr(T, name)
        if not callable(obj):
            continue
        try:
            hints = typing.get_type_hints(obj)
        except TypeError:
            continue
        for pname, hint in hints.items():
            assert not any(t in raw_types for t in (*typing.get_args(hint), hint)), (name, pname)
        if inspect.isfunction(obj):
            params = set(inspect.signature(obj).parameters)
            assert not params & {"log", "records", "query", "url", "sampled"}, (name, params)
    assert set(inspect.signature(T.tune).parameters) == {
        "population", "optin_fraction", "epsilon", "delta", "target_ndcg", "inputs", "trials", "seed", "noise",
        "workers", "progress", "head_list_size", "estimator"}
    fields = typing.get_type_hints(T.PrivatizedInputs)
    assert RecordLog not in fields.values()


@pytest.fixture(scope="module")
def small_result(small_files):
    inputs = T.load_privatized(*small_files)
    return T.tune(50_000, 0.1, 4.0, 1e-5, inputs=inputs, trials=3, seed=3, workers=2)


def test_tune_small_population_valid_choice(small_result) -> None:
    r = small_result
    c = r.chosen
    assert c.f_o in T.GRID_F_O and c.f_c in T.GRID_F_C and c.head_list_size in r.search["m_grid"]
    assert c.reached and c.min_records == c.head_list_size
    assert c.head_list_size <= r.search["max_formable_m"][f"{c.f_o:g}"]
    assert 0 < c.ndcg.lo <= c.ndcg.mean <= c.ndcg.hi <= 1 and 0 <= c.l1.lo <= c.l1.mean <= c.l1.hi
    assert r.met == (c.ndcg.mean >= r.target_ndcg)
    d = r.paper_defaults
    assert (d.f_o, d.f_c, d.head_list_size) == (0.95, 0.85, c.head_list_size)
    obj = r.to_json()
    json.dumps(obj, allow_nan=False)
    assert obj["fit"]["source"] == "privatized" and obj["met"] == r.met


def test_tune_interval_consistent_with_resimulation(small_result) -> None:
    """Re-simulating the choice on new populations from the same model lands within the interval."""
    r = small_result
    c = r.chosen
    params = BlenderParams(optin_fraction=0.1, f_o=c.f_o, f_c=c.f_c, head_list_size=c.head_list_size)
    ndcg = []
    for s in range(6):
        log = r.model.sample_log(50_000, np.random.default_rng(100 + s))
        run = run_blender(log, params, seed=200 + s)
        truth = Truth.from_records(log.query, log.url)
        ndcg.append(generalized_ndcg(run.head_list, run.blended.queries_final, run.blended.records_final, truth))
    resim = float(np.mean(ndcg))
    se = float(np.std(ndcg, ddof=1)) / np.sqrt(len(ndcg))
    assert c.ndcg.lo - 3 * se - 0.01 <= resim <= c.ndcg.hi + 3 * se + 0.01, (resim, c.ndcg)


def test_m_grid_and_interval() -> None:
    assert T.m_grid(51) == [51, 38, 28, 21, 15, 11, 8, 6, 5]
    assert T.m_grid(3) == [3, 2, 1] or T.m_grid(3)[0] == 3
    iv = T.Interval.of([0.9, 0.92, 0.94], 0.0, 1.0)
    assert iv.mean == pytest.approx(0.92) and iv.hi - iv.mean == pytest.approx(4.303 * 0.02 / np.sqrt(3), rel=1e-3)


# ----- CLI ---------------------------------------------------------------------------------


def invoke(*args: object) -> typing.Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_cli_json_happy_path(small_files) -> None:
    hl, est = small_files
    r = invoke("tune", "--population", 50_000, "--optin-fraction", 0.1, "--epsilon", 4, "--headlist", hl,
               "--optin-estimates", est, "--trials", 2, "--seed", 1, "--json")
    assert r.exit_code == 0, r.output + r.stderr
    obj = json.loads(r.stdout)
    for key in ("f_o", "f_c", "head_list_size", "ndcg", "l1", "paper_defaults", "fit", "target_ndcg", "met"):
        assert key in obj
    assert set(obj["ndcg"]) == set(obj["l1"]) == {"mean", "lo", "hi"}
    assert obj["fit"]["source"] == "privatized" and "parameters" in obj["fit"]
    assert obj["delta"] == 1e-5 and obj["target_ndcg"] == 0.95 and isinstance(obj["met"], bool)
    assert obj["paper_defaults"]["f_o"] == 0.95 and obj["paper_defaults"]["f_c"] == 0.85


def test_cli_table_with_prior() -> None:
    r = invoke("tune", "--population", 20_000, "--optin-fraction", 0.2, "--epsilon", 4, "--trials", 2, "--seed", 1,
               "--workers", 1)
    assert r.exit_code == 0, r.output + r.stderr
    assert "prior" in r.stdout and "paper defaults" in r.stdout and "NDCG" in r.stdout
    assert "no extra privacy cost" in r.stdout


def test_cli_estimator_reaches_the_simulations() -> None:
    """Same seed, pooled blend weights or S reused: the simulations estimate differently (other NDCG and L1
    figures; with S reused, f_O trades differently, so tune may pick other knobs)."""
    common = ("tune", "--population", 20_000, "--optin-fraction", 0.2, "--epsilon", 4, "--trials", 2, "--seed", 1,
              "--workers", 1, "--json")
    paper = json.loads(invoke(*common, "--estimator", "paper").stdout)
    pooled = json.loads(invoke(*common, "--estimator", "pooled").stdout)
    assert (paper["search"]["estimator"], pooled["search"]["estimator"]) == ("paper", "pooled")
    figures = ("ndcg", "l1", "paper_defaults")
    assert [paper[k] for k in figures] != [pooled[k] for k in figures]
    reuse = json.loads(invoke(*common).stdout)
    assert reuse["search"]["estimator"] == "reuse"  # the default
    assert reuse["paper_defaults"]["l1"] != paper["paper_defaults"]["l1"]


@pytest.mark.parametrize(("args", "needles"), [
    (("--population", 500), ("--population", "500", "1,000")),
    (("--optin-fraction", 0), ("--optin-fraction", "0")),
    (("--optin-fraction", 1.5), ("--optin-fraction", "1.5")),
    (("--epsilon", 0.5), ("--epsilon", "0.5", "ln 2")),
    (("--delta", 0), ("--delta",)),
    (("--delta", 1), ("--delta",)),
    (("--target-ndcg", 0), ("--target-ndcg", "(0, 1]")),
    (("--target-ndcg", 1.2), ("--target-ndcg", "1.2")),
    (("--trials", 1), ("--trials", "at least 2")),
])
def test_cli_bad_inputs_one_line(args, needles) -> None:
    base = {"--population": 50_000, "--optin-fraction": 0.1, "--epsilon": 4.0}
    base.update({args[0]: args[1]})
    flat = [x for kv in base.items() for x in kv]
    r = invoke("tune", *flat)
    assert r.exit_code == 2, r.output
    text = r.stderr
    assert text.startswith("error: ") and text.count("\n") == 1 and "Traceback" not in text
    for n in needles:
        assert n in text, text


def test_cli_bad_files(small_files, big_files, tmp_path) -> None:
    hl, est = small_files
    common = ("tune", "--population", 50_000, "--optin-fraction", 0.1, "--epsilon", 4)
    cases = [
        (("--headlist", hl), "--optin-estimates is missing"),
        (("--optin-estimates", est), "--headlist is missing"),
        (("--headlist", tmp_path / "nope.json", "--optin-estimates", est), "not found"),
        (("--headlist", hl, "--optin-estimates", big_files[1]), "head list"),  # estimates of another head list
    ]
    for extra, needle in cases:
        r = invoke(*common, *extra)
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
    r = invoke("tune", "--population", 2_000, "--optin-fraction", 0.1, "--epsilon", 4, "--headlist", hl,
               "--optin-estimates", est)
    assert r.exit_code == 2 and "--population" in r.stderr and "5,000 opt-in users" in r.stderr, r.stderr
