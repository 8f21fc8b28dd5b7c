"""Sizing a round before it starts (hybriddp.tune.sizing; issue 42): the forecast against the shipped curator.

The forecast's E|HL_S| and P(empty) are checked against many runs of the library's own CreateHeadList
(``curator_side``) on populations drawn from a small model, and one record's pass probability against a direct
sum over the Poisson count and the exact discrete Laplace law (written out here, not taken from the code).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybriddp.core.errors import EmptyHeadListError
from hybriddp.core.params import BlenderParams, head_list_threshold
from hybriddp.curator.party import curator_side
from hybriddp.tune.model import PopulationModel
from hybriddp.tune.sizing import MAX_OPTIN, _Passes, forecast_round


def _model(p: list[float]) -> PopulationModel:
    n = len(p)
    return PopulationModel(np.arange(n, dtype=np.int64), np.asarray(p), np.zeros(n), True, "prior", "test model")


def _discrete_pass(lam: float, epsilon: float, delta: float) -> float:
    """P[N ≥ 1 and N + Y > τ], N ~ Poisson(λ), Y two-sided geometric with P(y) ∝ e^{−|y|ε/2} (m_O = 1), τ the
    discrete mechanism's integer threshold ⌈τ_cont⌉ — summed directly."""
    tau = math.ceil(head_list_threshold(epsilon, delta, 1) - 1e-12)
    q = math.exp(-epsilon / 2.0)
    norm = (1 - q) / (1 + q)
    total = 0.0
    for k in range(1, 400):
        pk = math.exp(-lam + k * math.log(lam) - math.lgamma(k + 1))
        need = tau - k + 1  # Y ≥ τ − k + 1 ⇔ k + Y > τ
        tail = q ** need / (1 - q) * norm if need >= 1 else 1.0 - q ** (1 - need) / (1 - q) * norm
        total += pk * tail
    return total


def test_threshold_and_one_record_pass_probability_match_a_direct_sum() -> None:
    passes = _Passes(_model([0.01]), 4.0, 1e-5, 1, "discrete")
    assert passes.tau == math.ceil(0.5 * (2.0 - math.log(1e-5)))  # τ = b(ln e^{ε/2} − ln δ), b = 2/ε, made integer
    for lam in (2.0, 5.0, 7.0, 12.0, 30.0):
        mean, _, empty = passes.moments(round(lam / 0.01))
        assert mean == pytest.approx(_discrete_pass(lam, 4.0, 1e-5), abs=2e-3)
        assert empty == pytest.approx(1.0 - mean, abs=2e-3)


def test_forecast_matches_the_shipped_curator() -> None:
    """E|HL_S| and P(empty) against 300 runs of curator_side on fresh populations of 1,000 opt-in users."""
    p = [0.02, 0.012, 0.009, 0.007, 0.006, 0.005, 0.004, 0.003, 0.002, 0.001]
    model = _model(p)
    params = BlenderParams(epsilon=4.0, delta=1e-5, head_list_size=50, f_o=0.95)
    n = 1000
    fc = forecast_round(params, optin_users=n, model=model)
    rng = np.random.default_rng(42)
    sizes = []
    for i in range(300):
        log = model.sample_log(n, rng)
        try:
            cur = curator_side(log, np.arange(n), params, seed=i, with_charges=False)
            sizes.append(cur.head_list_s.n_records)
        except EmptyHeadListError:
            sizes.append(0)
    sizes_a = np.asarray(sizes, dtype=np.float64)
    se = sizes_a.std(ddof=1) / math.sqrt(sizes_a.size)
    assert abs(sizes_a.mean() - fc.head_list_mean) < 5 * se + 0.05, (sizes_a.mean(), fc.head_list_mean)
    empty = float((sizes_a == 0).mean())
    assert abs(empty - fc.p_empty) < 5 * math.sqrt(fc.p_empty * (1 - fc.p_empty) / sizes_a.size) + 0.01
    lo, hi = fc.head_list_range
    assert ((sizes_a >= lo) & (sizes_a <= hi)).mean() >= 0.8  # the "90%" range holds most runs


def test_needed_users_are_the_smallest_that_reach_the_size() -> None:
    model = _model([0.02, 0.01, 0.005, 0.002])
    params = BlenderParams(head_list_size=3)
    fc = forecast_round(params, model=model)
    assert fc.optin_for_one is not None and fc.optin_for_full is not None
    assert fc.optin_for_one < fc.optin_for_full
    at = forecast_round(params, optin_users=fc.optin_for_one, model=model)
    below = forecast_round(params, optin_users=int(fc.optin_for_one * 0.98), model=model)
    assert at.p_empty <= 0.01 + 1e-9 < below.p_empty
    # four records of which the rarest has p = 0.002: all 4 need more users than 3 do, and 5 can never form
    assert forecast_round(BlenderParams(head_list_size=5), model=model).optin_for_full is None
    assert MAX_OPTIN >= 10**9


def test_warnings_name_the_fix() -> None:
    model = _model([0.02, 0.01, 0.005, 0.002])
    tiny = forecast_round(BlenderParams(head_list_size=4), optin_users=50, model=model)
    assert tiny.p_empty > 0.5 and "likely list nothing" in tiny.warnings[0]
    assert f"{tiny.optin_for_one:,} opt-in users" in tiny.warnings[0]
    short = forecast_round(BlenderParams(head_list_size=4), optin_users=800, model=model)
    assert short.p_empty < 0.5 and short.warnings and "short" in short.warnings[0]
    enough = forecast_round(BlenderParams(head_list_size=2), optin_users=20_000, model=model)
    assert enough.warnings == []


def test_ndcg_is_simulated_only_with_both_groups() -> None:
    model = _model([0.05, 0.03, 0.02, 0.01] + [0.005] * 10)
    params = BlenderParams(head_list_size=5)
    assert forecast_round(params, optin_users=3000, model=model).ndcg is None
    fc = forecast_round(params, optin_users=3000, devices=30_000, model=model, ndcg_trials=2, seed=3)
    assert fc.ndcg is not None and 0.9 < fc.ndcg <= 1.0 and fc.ndcg_trials == 2
    doc = fc.to_json()
    assert doc["head_list_range"] == list(fc.head_list_range) and doc["tau"] == fc.tau
