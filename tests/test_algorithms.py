"""The baselines behind the same interface as BLENDER, each with an exact privacy test."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from hybriddp import BlenderParams
from hybriddp.cli import cli
from hybriddp.core.headlist import HeadList, record_keys
from hybriddp.core.noise import effective_scale
from hybriddp.core.params import head_list_scale
from hybriddp.core.records import ArrayVocabulary, RecordLog, sample_records
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution, privacy_loss_delta
from hybriddp.simulation.algorithms import ALGORITHMS, blender_family, run_algorithm, run_central
from hybriddp.simulation.pipeline import run_blender
from logdata import zipf_log

PARAMS = BlenderParams(optin_fraction=0.2, head_list_size=25)


@pytest.fixture(scope="module")
def log() -> RecordLog:
    return zipf_log(n_users=15_000, seed=8)


def test_family_is_paired_and_each_member_is_what_it_says(log) -> None:
    fam = blender_family(log, PARAMS, seed=4)
    assert set(fam) == {"blender", "optin-only", "client-only", "blender-pooled"}
    b, o, c, pooled = fam["blender"], fam["optin-only"], fam["client-only"], fam["blender-pooled"]
    assert b.head_list is o.head_list is c.head_list is pooled.head_list  # one run: same head list and truth
    assert np.array_equal(pooled.truth_record, b.truth_record)
    assert np.array_equal(b.truth_record, o.truth_record) and np.array_equal(b.truth_query, c.truth_query)
    assert np.array_equal(o.p_query, b.optin.p_query) and np.array_equal(c.p_query, b.client.p_query)
    assert np.array_equal(b.p_query, b.blended.queries.p)
    for r in fam.values():
        assert r.p_record.sum() == pytest.approx(1.0) and (r.p_record >= 0).all()  # projected
        assert 0 < r.metrics["ndcg"] <= 1


def test_central_uses_every_user(log) -> None:
    res = run_central(log, PARAMS, seed=2)
    assert res.sizes["users_s"] + res.sizes["users_t"] == log.n_users
    assert res.sizes["users_s"] == round(PARAMS.f_o * log.n_users)
    assert res.n_records == PARAMS.head_list_size
    # the upper bound: everyone's data at the curator beats opt-in-only on average
    opt = [blender_family(log, PARAMS, seed=s)["optin-only"].metrics["l1"] for s in range(3)]
    cen = [run_central(log, PARAMS, seed=s).metrics["l1"] for s in range(3)]
    assert np.mean(cen) < np.mean(opt)


def test_run_algorithm_rejects_unknown_name(log) -> None:
    with pytest.raises(ValueError, match="algorithm"):
        run_algorithm("magic", log, PARAMS)


# ----- privacy -------------------------------------------------------------------------------
def _neighbours(rng: np.random.Generator, m: int) -> tuple[RecordLog, RecordLog]:
    """Two logs that differ in the records of one user (ALGORITHM.md §1 neighbouring notion)."""
    n_users, per = 200, m
    q = rng.integers(0, 6, n_users * per)
    u = rng.integers(0, 3, n_users * per)
    q2, u2 = q.copy(), u.copy()
    victim = rng.integers(n_users)
    sl = slice(victim * per, (victim + 1) * per)
    q2[sl] = rng.integers(0, 9, per)  # may be records the other log has never seen
    u2[sl] = rng.integers(0, 5, per)
    off = np.arange(0, n_users * per + 1, per)
    voc = ArrayVocabulary([str(i) for i in range(10)])
    return (RecordLog(off, q.astype(np.int32), u.astype(np.int32), voc, voc),
            RecordLog(off, q2.astype(np.int32), u2.astype(np.int32), voc, voc))


@pytest.mark.parametrize("m_o", [1, 2, 3])
def test_curator_counts_have_sensitivity_2_m_and_laplace_gives_epsilon(m_o: int) -> None:
    """optin-only and central release Laplace(2m_O/ε)-noised counts (ALGORITHM.md §3, §4): one user's
    m_O records move the count vector by at most 2·m_O in L1, so the exact privacy loss
    |Σ|x−c|−Σ|x−c'||/b ≤ ‖c−c'‖₁/b ≤ ε at every output x."""
    rng = np.random.default_rng(m_o)
    eps = 1.5
    b = head_list_scale(eps, m_o)  # the scale the curator's Laplace noise uses (not recomputed here)
    t = effective_scale("discrete", b)  # and the scale its default discrete noise draws with
    hl = HeadList.from_lists([0, 1, 2], [[0, 1], [2], []])
    worst_l1 = 0
    for _ in range(300):
        a, a2 = _neighbours(rng, m_o)
        users = np.arange(a.n_users)
        # same sampling randomness on both sides (the mechanism's coins are fixed by the seed)
        s1 = sample_records(a, users, m_o, np.random.default_rng(7))
        s2 = sample_records(a2, users, m_o, np.random.default_rng(7))
        # EstimateOptinProbabilities: counts per head-list entry
        c1 = np.bincount(hl.map_records(s1.query, s1.url), minlength=hl.n_entries)
        c2 = np.bincount(hl.map_records(s2.query, s2.url), minlength=hl.n_entries)
        # CreateHeadList: counts per distinct record (union of supports)
        k1, n1 = np.unique(record_keys(s1.query, s1.url), return_counts=True)
        k2, n2 = np.unique(record_keys(s2.query, s2.url), return_counts=True)
        keys = np.union1d(k1, k2)
        d1 = np.zeros(len(keys))
        d2 = np.zeros(len(keys))
        d1[np.searchsorted(keys, k1)] = n1
        d2[np.searchsorted(keys, k2)] = n2
        for x1, x2 in ((c1, c2), (d1, d2)):
            l1 = np.abs(x1 - x2).sum()
            worst_l1 = max(worst_l1, l1)
            assert l1 <= 2 * m_o
            out = x1 + rng.laplace(0, b, len(x1))  # any output point
            loss = abs(np.abs(out - x1).sum() - np.abs(out - x2).sum()) / b
            assert loss <= eps + 1e-9
            # the discrete noise at an integer output: log P[x1 + Y = o]/P[x2 + Y = o] = (|o−x2|−|o−x1|)/t
            o = x1 + np.round(rng.laplace(0, t, len(x1)))
            assert abs(np.abs(o - x1).sum() - np.abs(o - x2).sum()) / t <= eps + 1e-9
    assert worst_l1 == 2 * m_o  # the bound is attained, so the test is tight
    # an output beyond both count vectors on every differing coordinate attains the loss ‖c−c'‖₁/scale:
    # with the worst neighbours that is 2m_O/b and 2m_O/t, which must be ε (not less: no wasted budget)
    assert 2 * m_o / b == pytest.approx(eps, rel=1e-12)
    assert eps * (1 - 1e-6) <= 2 * m_o / t <= eps * (1 + 1e-12)


def test_client_only_randomizer_is_exactly_epsilon_delta_ldp(log) -> None:
    """client-only reports through LocalAlg over the run's own head list: exact DP check."""
    params = BlenderParams(epsilon=2.0, delta=1e-3, optin_fraction=0.2, head_list_size=8)
    run = run_blender(log, params, seed=1)
    hl = run.head_list
    lp = LocalAlgParams.build(hl, params.epsilon, params.delta, params.f_c, params.m_c)
    assert lp.t == run.lp.t
    assert privacy_loss_delta(output_distribution(run.lp), params.epsilon) <= params.delta
    # and with twice the budget claimed it would not hold at ε/2: the check has teeth
    assert privacy_loss_delta(output_distribution(run.lp), params.epsilon / 2) > params.delta


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cli_run_every_algorithm(tmp_path, algorithm: str) -> None:
    from logdata import write_aol
    path = tmp_path / "log.tsv"
    write_aol(zipf_log(n_users=6_000, seed=2), path)
    result = CliRunner().invoke(cli, ["run", "--algorithm", algorithm, "--input", str(path), "--optin-fraction",
                                      "0.3", "-M", "15", "--seed", "1", "--json", "--output",
                                      str(tmp_path / "out.csv")])
    assert result.exit_code == 0, result.output + result.stderr
    obj = json.loads(result.stdout)
    assert obj["algorithm"] == algorithm
    for key in ("ndcg", "l1", "head_list_records", "head_list_queries", "epsilon", "delta"):
        assert key in obj
    assert (tmp_path / "out.csv").read_text().startswith('"query","url"')
