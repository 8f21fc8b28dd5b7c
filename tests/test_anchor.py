"""The opt-in anchor against poisoning (ALGORITHM.md §7.2): the test's calibration and false-alarm rate, the bound
against any reports, the attacks of issue 28 caught, the fake reports counted, and the results showing it."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from anchorhelpers import N_C, honest_round
from hybriddp.core.errors import ParameterError
from hybriddp.server.anchor import AnchorPolicy, holm, policy_named
from hybriddp.server.client_estimates import client_variances
from hybriddp.server.tails import normal_laplace_p, two_sided_p

ROUNDS = 1_500


def binomial_tail(n: int, p: float, k: int) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), summed exactly in log space."""
    return sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
                        + (n - i) * math.log1p(-p)) for i in range(k, n + 1))


def test_holm_rejects_what_its_definition_rejects() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        m = int(rng.integers(1, 30))
        p = np.where(rng.random(m) < 0.3, rng.random(m) * 1e-3, rng.random(m))
        alpha = float(rng.choice([0.01, 0.05, 0.2]))
        # the definition: with p sorted ascending, j* = the first j (1-based) with p_(j) > α/(m − j + 1);
        # reject exactly the hypotheses before it
        srt = sorted(range(m), key=lambda i: (p[i], i))
        expect = set()
        for j, i in enumerate(srt, 1):
            if p[i] > alpha / (m - j + 1):
                break
            expect.add(i)
        assert set(np.flatnonzero(holm(p, alpha)).tolist()) == expect


def test_two_sided_p_is_the_normal_tail() -> None:
    z = np.array([0.0, 1.0, -1.96, 3.5, -6.0, np.nan])
    want = [2.0 * (1.0 - NormalDist().cdf(abs(x))) if math.isfinite(x) else math.nan for x in z]
    np.testing.assert_allclose(two_sided_p(z), want, rtol=1e-9, atol=1e-15)


def test_honest_rounds_z_is_standard_normal_and_false_alarms_stay_below_alpha() -> None:
    """Over honest rounds, every entry's and query's z has mean 0 and variance at most 1 (the test's variances are
    taken one opt-in standard deviation above the anchor, so it errs on the safe side), and
    rounds with any flag are no more frequent than α allows (Holm: family-wise rate ≤ α)."""
    rng = np.random.default_rng(20261127)
    policy = AnchorPolicy(alpha=0.02)
    zs, flagged = [], 0
    for _ in range(ROUNDS):
        r = honest_round(rng)
        _, _, check = r.defend(r.counts, policy)
        zs.append(np.concatenate([check.records.z, check.queries.z]))
        flagged += check.flagged_any
    z = np.array(zs)
    se = 1.0 / math.sqrt(ROUNDS)
    assert np.abs(z.mean(0)).max() < 5 * se
    # the variance of a sample variance of normals is 2/(n − 1): 5 s.e. ≈ 0.18 at 1,500 rounds
    var = z.var(0, ddof=1)
    assert var.max() < 1.0 + 5 * math.sqrt(2.0 / (ROUNDS - 1)) and var.min() > 0.7
    assert binomial_tail(ROUNDS, policy.alpha, flagged) > 1e-6, f"{flagged} of {ROUNDS} honest rounds flagged"


def _bound_unit(r: object, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s = σ²_O/√(σ²_O + σ²_C) per entry and per query, both variances at x = the anchor (the opt-in estimate
    clamped into [0, 1]) plus one opt-in standard deviation, with n the reports received: what no report moves but
    their number (computed here from the variance functions, not read from the check)."""
    a_r, a_q = np.clip(r.optin.p_record, 0, 1), np.clip(r.optin.p_query, 0, 1)
    vo_r, vo_q = r.optin.variances_at(a_r, a_q)
    x_r, x_q = np.clip(a_r + np.sqrt(vo_r), 0, 1), np.clip(a_q + np.sqrt(vo_q), 0, 1)
    to_r, to_q = r.optin.variances_at(x_r, x_q)
    tc_r, tc_q = client_variances(x_r, x_q, r.hl, r.lp, int(counts.sum()))
    return to_r / np.sqrt(to_r + tc_r), to_q / np.sqrt(to_q + tc_q)


def test_no_reports_move_an_entry_past_its_bound() -> None:
    """Whatever the reports, every entry and query (flagged or not) lies within κ_i·s_i of its opt-in estimate, κ_i
    the fixed κ or, per round, at most the test's critical z; the suggestions' ranking score at most κ_q·s above it
    (κ_q fixed, or per round and query at most κ_i; 0 where flagged); and the queries' estimates and ranking scores
    are probabilities (the records here are not projected: raw)."""
    rng = np.random.default_rng(7)
    for trial in range(60):
        r = honest_round(rng)
        n_e = r.hl.n_entries
        kind = trial % 4
        if kind == 0:  # everything on one entry
            counts = r.counts.copy()
            counts[rng.integers(n_e)] += int(rng.integers(1, 200_000))
        elif kind == 1:  # arbitrary counts
            counts = rng.integers(0, 5_000, n_e)
        elif kind == 2:  # a few entries emptied, others inflated
            counts = r.counts.copy()
            counts[rng.choice(n_e, 4, replace=False)] = 0
            counts[rng.choice(n_e, 2, replace=False)] *= 3
        else:  # a small push on a random entry
            counts = r.counts.copy()
            counts[rng.integers(n_e)] += int(rng.integers(1, 400))
        kappa = None if trial % 3 == 0 else float(rng.choice([0.0, 0.25, 0.5, 2.0]))
        kappa_q = float(rng.choice([0.0, 0.25, 0.5, 2.0]))
        kappa_q = None if trial % 2 == 0 else kappa_q  # the default: per round and query
        _, out, check = r.defend(counts, AnchorPolicy(kappa=kappa, kappa_query=kappa_q))
        s_r, s_q = _bound_unit(r, counts)
        for side, p_o, s in ((check.records, r.optin.p_record, s_r), (check.queries, r.optin.p_query, s_q)):
            k = side.kappa
            assert np.all(k <= check.critical_z + 1e-12) if kappa is None else np.all(k == kappa)
            assert np.all(np.abs(side.defended.p - p_o) <= k * s * (1 + 1e-12) + 1e-15)
        rank = out.queries_ranking  # one-sided: at most the opt-in estimate + κ_q·s (flagged: + 0), never above
        k_q = check.queries.kappa_rank  # per query and round (None), else the fixed one; 0 where flagged
        if kappa_q is None:  # at most the estimate's own κ_i (≤ the test's critical z)
            assert np.all(k_q <= check.queries.kappa + 1e-12)
        else:
            assert np.all(k_q == np.where(check.queries.flagged, 0.0, kappa_q))
        assert np.all(k_q[check.queries.flagged] == 0.0)
        assert np.all(rank <= np.clip(r.optin.p_query + k_q * s_q * (1 + 1e-12), 0, 1) + 1e-15)
        assert np.all(rank <= out.queries_final + 1e-15)
        for published in (out.queries_final, rank):  # records: unprojected here (project=False), raw
            assert np.all((published >= 0.0) & (published <= 1.0))


def test_direct_attack_is_flagged_bounded_and_counted() -> None:
    """Issue 28's attack: 1% fakes report one small entry outright. Undefended it about doubles; defended it is
    flagged, published within its bound of the opt-in estimate, and the excess reports come out close to the
    fakes sent."""
    rng = np.random.default_rng(11)
    for _ in range(10):
        r = honest_round(rng)
        target = int(np.argmin(np.where(r.hl.is_wildcard, np.inf, r.p)))
        fakes = N_C // 100
        counts = r.counts.copy()
        counts[target] += fakes
        _, raw = r.estimate(counts)
        assert raw.records.p[target] > 1.8 * r.p[target]  # the undefended blend about doubles it
        _, out, check = r.defend(counts)
        assert check.records.flagged[target]
        moved = out.records.p[target] - r.optin.p_record[target]
        assert moved <= check.records.bound[target] * (1 + 1e-12)
        assert out.records.p[target] < raw.records.p[target]
        assert check.excess_reports > 0.5 * fakes
    for _ in range(10):  # 5%: the excess is the fakes ± the honest count's noise (sd ≈ √(n·r) ≈ 18) and the
        r = honest_round(rng)  # anchor's (n·D_q·σ_O ≈ 20,000 · 0.18 · 0.002 ≈ 40 here): 5 sd < 25% of 1,000
        target = int(np.argmin(np.where(r.hl.is_wildcard, np.inf, r.p)))
        fakes = N_C // 20
        counts = r.counts.copy()
        counts[target] += fakes
        _, out, check = r.defend(counts)
        assert abs(check.excess_reports - fakes) < 0.25 * fakes
        assert check.fake_fraction_lower == pytest.approx(check.excess_reports / counts.sum())


def test_cleaning_undoes_the_dilution_of_honest_entries() -> None:
    """10% fakes on one entry lower every other client estimate (they dilute the honest reports). After their excess
    is taken out, the other entries publish what the honest round publishes (to a fraction of their s.e.), while
    the undefended blend of the attacked round is off by more; the client estimates reported stay those of the
    reports as received."""
    rng = np.random.default_rng(13)
    r = honest_round(rng)
    target = 3
    counts = r.counts.copy()
    counts[target] += N_C // 10
    honest, _ = r.estimate(r.counts)
    attacked, _ = r.estimate(counts)
    _, out_honest, _ = r.defend(r.counts)
    received, out, check = r.defend(counts)
    np.testing.assert_array_equal(received.p_record, attacked.p_record)
    others = np.setdiff1d(np.flatnonzero(~check.records.flagged), [target])
    sd = np.sqrt(honest.var_record[others])
    assert np.abs(attacked.p_record[others] - honest.p_record[others]).max() > 0.5 * sd.max()  # diluted
    assert np.all(np.abs(out.records.p[others] - out_honest.records.p[others]) < 0.3 * sd)


def test_many_fakes_cannot_publish_a_probability_above_one_or_below_zero() -> None:
    """Issue 28: 100,000 fakes gave the target p = 1.65 and every other query a negative value. Now the target is
    flagged and every published record and query lies in [0, 1]."""
    rng = np.random.default_rng(17)
    r = honest_round(rng)
    counts = r.counts.copy()
    counts[0] += 100_000
    _, raw = r.estimate(counts)
    assert raw.queries_final.max() > 1.0 and raw.queries_final.min() < 0.0  # what the undefended blend publishes
    _, out, check = r.defend(counts)
    assert check.records.flagged[0]
    for published in (out.records_final, out.queries_final, out.queries_ranking):
        assert published.min() >= 0.0 and published.max() <= 1.0


def test_policy_checks_its_knobs() -> None:
    with pytest.raises(ParameterError, match="--anchor-alpha"):
        AnchorPolicy(alpha=0.0)
    with pytest.raises(ParameterError, match="--anchor-kappa"):
        AnchorPolicy(kappa=-1.0)
    with pytest.raises(ParameterError, match="--anchor-kappa-query"):
        AnchorPolicy(kappa_query=math.inf)
    with pytest.raises(ParameterError, match="--anchor-kappa-query"):
        AnchorPolicy(kappa_query=-0.1)
    with pytest.raises(ParameterError, match="--anchor-rank-cost"):
        AnchorPolicy(rank_cost=0.0)
    assert AnchorPolicy(kappa_query=None).to_dict()["kappa_query"] == "auto"
    with pytest.raises(ParameterError, match="--anchor-honest-cost"):
        AnchorPolicy(honest_cost=1.0)
    assert AnchorPolicy().kappa is None and AnchorPolicy().to_dict()["kappa"] == "auto"
    with pytest.raises(ParameterError, match="--defense"):
        policy_named("median")
    assert policy_named("none") is None
    assert policy_named("anchor", 0.05, 1.0) == AnchorPolicy(0.05, 1.0)


def test_no_report_moves_the_tests_denominator() -> None:
    """Two report vectors with the same number of reports: every z has the same standard deviation under it
    (σ_D at one opt-in standard deviation above the anchor, which only the opt-in release decides), so pushing the
    clients' estimate up cannot inflate the variance it is tested against."""
    rng = np.random.default_rng(23)
    r = honest_round(rng)
    pushed = r.counts.copy()
    pushed[np.argmax(r.counts)] -= 60
    pushed[3] += 60  # the same n, 60 reports moved onto one entry (z ≈ 2: below any critical value)
    sds = []
    for counts in (r.counts, pushed):
        client, _ = r.estimate(counts)
        _, _, check = r.defend(counts)
        assert not check.flagged_any  # one pass, no cleaning: the z's are of these counts
        sds.append((client.p_record - r.optin.p_record) / check.records.z)
    assert abs(sds[1][3] - sds[0][3]) < 1e-9 * sds[0][3]
    np.testing.assert_allclose(sds[0], sds[1], rtol=1e-9)


@pytest.mark.parametrize("share", [0.0, 0.3, 0.7, 1.0])
def test_the_normal_laplace_tail_is_the_sums_tail(share: float) -> None:
    """P(|G + L| ≥ t) for G normal with variance 1 − f and L Laplace with variance f, against 1,000,000 draws of the
    sum itself (independent of the closed form): within 5 binomial standard errors at t = 1, 2.5, 4."""
    rng = np.random.default_rng(31)
    n = 1_000_000
    x = math.sqrt(1 - share) * rng.standard_normal(n) + rng.laplace(0.0, math.sqrt(share / 2), n)
    for t in (1.0, 2.5, 4.0):
        p = float(normal_laplace_p(np.array([t]), np.array([share]))[0])
        emp = float((np.abs(x) >= t).mean())
        assert abs(emp - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-6, (t, emp, p)


def test_published_query_estimates_are_clipped_into_0_1_in_the_results_table() -> None:
    """Issue 28: every published estimate is in [0, 1]. With κ = 0 a query publishes its opt-in estimate, which the
    curator's noise makes negative for small queries of a small T; the results' ``p_blended`` (what the service
    publishes and the local-search document is built from) must be that estimate clipped, with the raw value in
    ``p_blended_raw``."""
    from hybriddp.core.params import BlenderParams
    from hybriddp.server.party import serve_estimates
    from hybriddp.simulation.pipeline import run_blender
    from logdata import zipf_log

    log = zipf_log(3_000, 60, 3, seed=5)
    params = BlenderParams(epsilon=4.0, delta=1e-5, optin_fraction=0.05, head_list_size=30)
    negative = 0
    for seed in range(8):
        run = run_blender(log, params, seed=seed)
        res = serve_estimates(run.release, run.report_counts, defense=AnchorPolicy(kappa=0.0, kappa_query=0.0))
        table = res.queries_table()
        p, raw = (np.asarray(table.column(c).to_pylist(), dtype=float) for c in ("p_blended", "p_blended_raw"))
        assert np.all((p >= 0.0) & (p <= 1.0)) and np.array_equal(p, res.blended.queries_final)
        # the clipped raw value, except where it contradicted its own listed URLs: there the agreement step
        # (ALGORITHM.md §7.3) raised it, never above 1, and it then holds at least their sum
        hl = res.head_list
        urls = np.bincount(hl.entry_query[~hl.is_wildcard], weights=res.p_record[~hl.is_wildcard],
                           minlength=hl.k)[:p.size]
        raised = p != np.clip(raw, 0.0, 1.0)
        assert np.all(p[raised] > np.clip(raw, 0.0, 1.0)[raised]) and np.all(p >= urls - 1e-12)
        negative += int((raw < 0).sum())
    assert negative > 0  # the case the test is about happened
