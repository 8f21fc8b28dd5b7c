"""The agreement of the published final columns (ALGORITHM.md §7.3, issue 42): no listed query below the sum of
its listed URLs. Expected values are hand-computed or found by brute force over the active sets, never from the
module's own formula."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from hybriddp.core.headlist import WILDCARD, HeadList
from hybriddp.server.agree import agree


def three_queries() -> HeadList:
    """q0: URLs e0, e1, ⟨q0,*⟩ e2; q1: URL e3, ⟨q1,*⟩ e4; q2: no URL, ⟨q2,*⟩ e5; ⟨*,*⟩ e6 (k = 4)."""
    return HeadList.from_lists([10, 11, 12], [[1, 2], [3], []])


def test_hand_case_moves_the_query_up_and_its_urls_down_by_their_variances() -> None:
    """q0: y_q = 0.1, URLs 0.08 + 0.06 = 0.14, all variances 1: d = 0.04 split in thirds, so q0 → 0.1 + 0.04/3,
    each URL − 0.04/3, and ⟨q0,*⟩ gets the 0.08/3 the URLs gave up. q1 (0.3 ≥ 0.2) and q2 (no URL) stay."""
    hl = three_queries()
    p_r = np.array([0.08, 0.06, 0.0, 0.2, 0.1, 0.05, 0.51])
    p_q = np.array([0.1, 0.3, 0.05, 0.51])
    out = agree(hl, p_r, np.ones(7), p_q, np.ones(4))
    third = 0.04 / 3
    assert out.p_query == pytest.approx([0.1 + third, 0.3, 0.05, 0.51], abs=1e-15)
    assert out.p_record == pytest.approx([0.08 - third, 0.06 - third, 2 * third, 0.2, 0.1, 0.05, 0.51], abs=1e-15)
    assert out.moved.tolist() == [True, False, False, False]
    assert out.p_record.sum() == pytest.approx(1.0, abs=1e-15)
    assert p_r.tolist() == [0.08, 0.06, 0.0, 0.2, 0.1, 0.05, 0.51]  # inputs untouched


def test_unequal_variances_by_hand() -> None:
    """q1 alone contradicted: y_q = 0.2 (v 3), URL 0.3 (v 1): d = 0.1, V = 4, the query takes 3/4 of d, the URL
    1/4: both 0.275, and ⟨q1,*⟩ 0.1 + 0.025."""
    hl = three_queries()
    p_r = np.array([0.1, 0.1, 0.05, 0.3, 0.1, 0.05, 0.3])
    p_q = np.array([0.25, 0.2, 0.05, 0.3])
    v_r = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    out = agree(hl, p_r, v_r, p_q, np.array([1.0, 3.0, 1.0, 1.0]))
    assert out.p_query[1] == pytest.approx(0.275, abs=1e-15) and out.p_record[3] == pytest.approx(0.275, abs=1e-15)
    assert out.p_record[4] == pytest.approx(0.125, abs=1e-15)
    assert np.array_equal(out.p_query[[0, 2, 3]], p_q[[0, 2, 3]])
    assert np.array_equal(out.p_record[[0, 1, 2, 5, 6]], p_r[[0, 1, 2, 5, 6]])


def test_a_url_the_projection_would_send_below_zero_is_fixed_at_zero() -> None:
    """q0: y_q = 0.1, URLs 0.2 and 0.001, variances 1. All three free: λ = 0.101/3 > 0.001, so the small URL is
    fixed at 0; then λ = (0.2 − 0.1)/2 = 0.05: q0 = 0.15, big URL 0.15 (KKT: the small URL's 0.001 − 0.05 < 0, so
    0 is right), and ⟨q0,*⟩ gets 0.05 + 0.001."""
    hl = three_queries()
    p_r = np.array([0.2, 0.001, 0.0, 0.2, 0.1, 0.05, 0.449])
    p_q = np.array([0.1, 0.3, 0.05, 0.449])
    out = agree(hl, p_r, np.ones(7), p_q, np.ones(4))
    assert out.p_query[0] == pytest.approx(0.15, abs=1e-15)
    assert out.p_record[:3] == pytest.approx([0.15, 0.0, 0.051], abs=1e-15)
    assert out.p_record[1] == 0.0
    assert out.p_record.sum() == pytest.approx(p_r.sum(), abs=1e-15)


def test_queries_without_urls_and_the_star_query_are_never_moved() -> None:
    """q2 has no listed URL: untouched even when its estimate is negative (the unprojected case); ⟨*,*⟩ too."""
    hl = three_queries()
    p_r = np.array([0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.3])
    p_q = np.array([0.3, 0.2, -0.01, 0.3])
    out = agree(hl, p_r, np.ones(7), p_q, np.ones(4))
    assert np.array_equal(out.p_query, p_q) and np.array_equal(out.p_record, p_r) and not out.moved.any()


def test_a_query_without_a_wildcard_entry_rises_to_its_urls_sum() -> None:
    """A hand-made list whose q0 has no ⟨q0,*⟩: nowhere to put the URLs' mass, so the URLs stay and the query is
    raised to their sum (0.08 + 0.06)."""
    hl = HeadList(np.array([10, 11]), np.array([0, 2, 4, 5]), np.array([1, 2, 3, WILDCARD, WILDCARD]))
    p_r = np.array([0.08, 0.06, 0.3, 0.2, 0.36])
    p_q = np.array([0.1, 0.5, 0.36])
    out = agree(hl, p_r, np.ones(5), p_q, np.ones(3))
    assert np.array_equal(out.p_record, p_r)
    assert out.p_query[0] == pytest.approx(0.14, abs=1e-15) and out.p_query[0] >= 0.08 + 0.06
    assert out.p_query[1:].tolist() == [0.5, 0.36]


def test_non_finite_and_extreme_variances() -> None:
    """An infinite variance takes the whole correction (the query with σ² = ∞ rises to the URLs' sum, the URLs
    stay); a zero-variance query stays and the URLs give it all up; NaN estimates leave their block alone."""
    hl = three_queries()
    p_r = np.array([0.08, 0.06, 0.0, 0.2, 0.1, 0.05, 0.51])
    p_q = np.array([0.1, 0.1, 0.05, 0.51])
    out = agree(hl, p_r, np.ones(7), p_q, np.array([np.inf, 0.0, 1.0, 1.0]))
    assert out.p_query[0] == pytest.approx(0.14, abs=1e-12) and out.p_record[:2] == pytest.approx([0.08, 0.06])
    assert out.p_query[1] == pytest.approx(0.1, abs=1e-15) and out.p_record[3] == pytest.approx(0.1, abs=1e-15)
    assert out.p_record[4] == pytest.approx(0.2, abs=1e-15)
    nan_q = p_q.copy()
    nan_q[0] = np.nan
    out = agree(hl, p_r, np.ones(7), nan_q, np.ones(4))
    assert np.isnan(out.p_query[0]) and np.array_equal(out.p_record[:3], p_r[:3])


# ----- brute force and properties -----------------------------------------------------------------------------------
def brute_projection(y_q: float, y_u: np.ndarray, v_q: float, v_u: np.ndarray) -> tuple[float, np.ndarray]:
    """The weighted projection of (y_q, y_u) onto {x_q ≥ Σx_u, x_u ≥ 0} by enumeration: every set Z of URLs at 0,
    the equality-constrained minimizer over the rest by its Lagrange condition solved with numpy's linear solver
    (no closed form), the feasible candidate (and y itself, if feasible) with the smallest objective."""
    m = y_u.size
    best: tuple[float, float, np.ndarray] | None = None
    if y_q >= y_u.sum() and (y_u >= 0).all():
        return y_q, y_u.copy()
    for size in range(m + 1):
        for zero in itertools.combinations(range(m), size):
            free = [i for i in range(m) if i not in zero]
            # unknowns (x_q, x_free…, μ): grad (x − y)/v + μ·g = 0, g = (−1, 1…), and x_q = Σ x_free
            n = len(free) + 2
            a = np.zeros((n, n))
            b = np.zeros(n)
            a[0, 0], a[0, -1], b[0] = 1.0 / v_q, -1.0, y_q / v_q
            for j, i in enumerate(free, 1):
                a[j, j], a[j, -1], b[j] = 1.0 / v_u[i], 1.0, y_u[i] / v_u[i]
            a[-1, 0] = -1.0
            a[-1, 1:-1] = 1.0
            sol = np.linalg.solve(a, b)
            x_u = np.zeros(m)
            x_u[free] = sol[1:-1]
            if (x_u < -1e-15).any():
                continue
            obj = (sol[0] - y_q) ** 2 / v_q + float((((x_u - y_u) ** 2) / v_u).sum())
            if best is None or obj < best[0] - 1e-18:
                best = (obj, float(sol[0]), x_u)
    assert best is not None
    return best[1], best[2]


def random_round(rng: np.random.Generator, n_queries: int) -> tuple[HeadList, np.ndarray, np.ndarray, np.ndarray,
                                                                      np.ndarray]:
    """A random list with records on the simplex (a projected column) and queries near their records' marginal
    with noise, clipped into [0, 1] (a clipped column), and random variances over several orders of magnitude."""
    urls = [list(range(int(rng.integers(0, 5)))) for _ in range(n_queries)]
    hl = HeadList.from_lists(range(n_queries), urls)
    p_r = rng.dirichlet(np.full(hl.n_entries, 0.7))
    p_r[rng.random(hl.n_entries) < 0.15] = 0.0
    p_r /= p_r.sum()
    marg = np.bincount(hl.entry_query, weights=p_r, minlength=hl.k)
    p_q = np.clip(marg + rng.normal(0.0, 0.05, hl.k) * marg.mean(), 0.0, 1.0)
    v_r = 10.0 ** rng.uniform(-9, -5, hl.n_entries)
    v_q = 10.0 ** rng.uniform(-9, -5, hl.k)
    return hl, p_r, v_r, p_q, v_q


def test_matches_the_brute_force_projection_on_random_blocks() -> None:
    rng = np.random.default_rng(42)
    checked = clipped = 0
    for _ in range(60):
        hl, p_r, v_r, p_q, v_q = random_round(rng, 6)
        p_q = np.where(rng.random(hl.k) < 0.3, 0.3 * p_q, p_q)  # far below their URLs: URLs reach 0
        out = agree(hl, p_r, v_r, p_q, v_q)
        for q in range(hl.k - 1):
            lo, hi = hl.url_offsets[q], hl.url_offsets[q + 1] - 1  # the URLs; hi is ⟨q,*⟩
            if hi == lo:
                continue
            x_q, x_u = brute_projection(p_q[q], p_r[lo:hi], v_q[q], v_r[lo:hi])
            assert out.p_query[q] == pytest.approx(x_q, rel=1e-9, abs=1e-15)
            assert out.p_record[lo:hi] == pytest.approx(x_u, rel=1e-9, abs=1e-15)
            assert out.p_record[hi] == pytest.approx(p_r[hi] + (p_r[lo:hi] - x_u).sum(), rel=1e-9, abs=1e-15)
            checked += out.moved[q]
            clipped += int(((x_u == 0) & (p_r[lo:hi] > 0)).sum())
    assert checked > 30 and clipped > 5  # contradictions happened, some with a URL fixed at 0


def test_properties_on_random_rounds() -> None:
    """After the step every listed query ≥ its URLs' sum − 1e-12 (here: exactly, as numpy sums), the records still
    sum to 1 and are ≥ 0, every estimate moves by at most its query's contradiction d, in the direction that
    removes it, and nothing moves in a query without a contradiction."""
    rng = np.random.default_rng(7)
    moved = 0
    for _ in range(200):
        hl, p_r, v_r, p_q, v_q = random_round(rng, int(rng.integers(1, 30)))
        out = agree(hl, p_r, v_r, p_q, v_q)
        eq, url = hl.entry_query, ~hl.is_wildcard
        sums = np.bincount(eq[url], weights=out.p_record[url], minlength=hl.k)
        listed = np.arange(hl.k) < hl.k - 1
        assert np.all(out.p_query[listed] >= sums[listed])
        assert out.p_record.sum() == pytest.approx(1.0, abs=1e-12) and (out.p_record >= 0).all()
        d = np.bincount(eq[url], weights=p_r[url], minlength=hl.k) - p_q
        contradicted = listed & (d > 0) & (np.bincount(eq[url], minlength=hl.k) > 0)
        assert np.array_equal(out.moved, contradicted)
        still = ~contradicted[eq]
        assert np.array_equal(out.p_record[still], p_r[still])
        assert np.array_equal(out.p_query[~contradicted], p_q[~contradicted])
        dd = np.where(contradicted, d, 0.0)
        assert np.all(out.p_query - p_q >= 0) and np.all(out.p_query - p_q <= dd * (1 + 1e-9) + 1e-16)
        change = out.p_record - p_r
        assert np.all(np.abs(change) <= dd[eq] * (1 + 1e-9) + 1e-16)
        assert np.all(change[url] <= 0.0) and np.all(change[~url] >= 0.0)
        # the records' marginal of every query is unchanged
        assert np.bincount(eq, weights=out.p_record, minlength=hl.k) == pytest.approx(
            np.bincount(eq, weights=p_r, minlength=hl.k), abs=1e-15)
        moved += int(contradicted.sum())
    assert moved > 100


def test_weighted_distance_to_any_feasible_point_does_not_grow() -> None:
    """Non-expansive: for random points z with z_q ≥ Σ_u z_u, z_u ≥ 0 (the truth is one), the weighted squared
    distance Σ (x − z)²/v over every query's block (the query and its URLs) is at most that of the input."""
    rng = np.random.default_rng(3)
    for _ in range(100):
        hl, p_r, v_r, p_q, v_q = random_round(rng, 8)
        out = agree(hl, p_r, v_r, p_q, v_q)
        eq, url = hl.entry_query, ~hl.is_wildcard
        for _ in range(20):
            z_r = np.where(url, rng.uniform(0.0, 0.2, hl.n_entries), 0.0)
            z_q = np.bincount(eq[url], weights=z_r[url], minlength=hl.k) + rng.exponential(0.02, hl.k)
            w_r, w_q = (p_r - z_r) ** 2 / v_r, (p_q - z_q) ** 2 / v_q  # per coordinate, before and after
            a_r, a_q = (out.p_record - z_r) ** 2 / v_r, (out.p_query - z_q) ** 2 / v_q
            before = np.bincount(eq[url], weights=w_r[url], minlength=hl.k) + w_q
            after = np.bincount(eq[url], weights=a_r[url], minlength=hl.k) + a_q
            assert np.all(after[:-1] <= before[:-1] * (1 + 1e-12) + 1e-12)


# ----- the published results ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo11() -> tuple[object, object]:
    """``hybriddp demo --seed 11`` as a library call (the aol preset, the paper's defaults, the default defense),
    with and without the agreement step."""
    import hybriddp.server.party as party
    from hybriddp import BlenderParams
    from hybriddp.datasets.synth import generate
    from hybriddp.simulation.pipeline import result_from_run, run_blender

    log = generate("aol", seed=11)
    params = BlenderParams.paper_defaults("aol")
    agreed = result_from_run(run_blender(log, params, seed=11))
    mp = pytest.MonkeyPatch()
    mp.setattr(party, "agree_blend", lambda blended, hl: blended)
    try:
        plain = result_from_run(run_blender(log, params, seed=11))
    finally:
        mp.undo()
    return agreed, plain


def test_demo_finals_agree_and_raw_columns_are_unchanged(demo11: tuple) -> None:
    res, plain = demo11
    hl = res.head_list
    eq, url = hl.entry_query, ~hl.is_wildcard
    sums = np.bincount(eq[url], weights=res.p_record[url], minlength=hl.k)
    assert np.all(res.p_query[:-1] >= sums[:-1] - 1e-12)
    before = np.bincount(eq[url], weights=plain.p_record[url], minlength=hl.k)
    assert np.any(plain.p_query[:-1] < before[:-1])  # the contradiction was there without the step
    assert res.p_record.sum() == pytest.approx(1.0, abs=1e-12) and (res.p_record >= 0).all()
    # Result, tables and metrics see the agreed finals
    rt, qt = res.records_table(), res.queries_table()
    assert np.array_equal(np.asarray(rt.column("p_blended").to_pylist()), res.p_record)
    assert np.array_equal(np.asarray(qt.column("p_blended").to_pylist()), res.p_query)
    # the raw blends, their variances and the Euclidean projection are those of the run without the step
    pt, pq = plain.records_table(), plain.queries_table()
    for col in ("p_blended_raw", "var_blended", "weight_optin"):
        assert rt.column(col).equals(pt.column(col)) and qt.column(col).equals(pq.column(col))
    assert np.array_equal(res.blended.records_projected, plain.blended.records_projected)
    # the ranking score: the agreed estimate capped at p̂_O + κ_q·s, never above it
    rank = res.blended.queries_ranking
    side = res.parts.check.queries
    assert np.all(rank <= res.p_query + 1e-15)
    with np.errstate(invalid="ignore"):
        cap = side.anchor + side.kappa_rank * side.s
    known = np.isfinite(cap)
    assert np.all(rank[known] <= np.clip(cap[known], 0.0, 1.0) + 1e-15)
    assert np.array_equal(rank, np.clip(np.where(known, np.minimum(res.p_query, np.where(known, cap, 0)),
                                                 res.p_query), 0, 1))


def test_local_search_suggests_no_query_or_url_at_zero(demo11: tuple) -> None:
    from hybriddp.service.closing import local_search

    res, _ = demo11
    doc = local_search(SimpleNamespace(id="r1", headlist_hash="h"), res)
    assert doc["queries"]
    for q in doc["queries"]:
        assert q["p"] > 0.0 and all(u["p"] > 0.0 for u in q["urls"])
        assert q["p"] >= sum(u["p"] for u in q["urls"]) - 1e-12
        assert "www.site" not in " ".join(u["url"] for u in q["urls"]) or q["query"].startswith("query ")


def test_local_search_leaves_out_queries_and_urls_at_zero() -> None:
    """A hand-made result: q1 published at 0 is not suggested; q0's URL at 0 is left out of its list."""
    from hybriddp.service.closing import local_search

    hl = three_queries()
    blended = SimpleNamespace(queries_final=np.array([0.3, 0.0, 0.05, 0.65]), queries_ranking=np.array(
        [0.3, 0.0, 0.05, 0.65]))
    res = SimpleNamespace(head_list=hl, blended=blended, parts=None,
                          p_record=np.array([0.2, 0.0, 0.1, 0.0, 0.0, 0.05, 0.65]),
                          query_names=lambda: ["a", "b", "c", "*"],
                          entry_names=lambda: (["a", "a", "a", "b", "b", "c", "*"], ["u1", "u2", "*", "u3", "*", "*",
                                                                                     "*"]))
    doc = local_search(SimpleNamespace(id="r", headlist_hash="h"), res)
    assert doc["queries"] == [{"query": "a", "p": 0.3, "urls": [{"url": "u1", "p": 0.2}]},
                              {"query": "c", "p": 0.05, "urls": []}]


def test_named_head_queries_secondary_urls_are_named_after_their_dominant_url() -> None:
    """The aol preset: google's second URL is http://www.google.com/page2 (no placeholder next to real names);
    queries sharing a dominant URL number their pages on; unnamed queries keep placeholders; ids and counts are
    the placeholders' (only names change), and every name round-trips through encode/decode."""
    from hybriddp.core.records import SyntheticVocabulary
    from hybriddp.datasets.generator import URL_PREFIX
    from hybriddp.datasets.presets import get_preset, head_urls

    pre = get_preset("aol")
    hu = head_urls(pre)
    n_named = len(pre.named_queries)
    vocab = SyntheticVocabulary(hu.n_urls, URL_PREFIX, hu.named)
    first = {}
    for h in range(n_named):
        names = vocab.decode(hu.ids[hu.ptr[h]:hu.ptr[h + 1]])
        assert names[0] == pre.named_urls[h]
        assert all(n.startswith(pre.named_urls[h] + "/page") for n in names[1:]), names
        first.setdefault(pre.named_urls[h], []).extend(names[1:])
    google = first["http://www.google.com"]
    assert google[:2] == ["http://www.google.com/page2", "http://www.google.com/page3"]
    assert len(set(google)) == len(google)  # "google", "google.com" and "www.google.com" share the domain
    assert [int(n.rsplit("page", 1)[1]) for n in google] == list(range(2, len(google) + 2))
    unnamed = vocab.decode(hu.ids[hu.ptr[n_named]:hu.ptr[n_named + 1]])
    assert all(n.startswith(URL_PREFIX) and n[len(URL_PREFIX):].isdigit() for n in unnamed)
    ids = np.arange(hu.n_urls)
    names = vocab.decode(ids)
    assert len(set(names)) == hu.n_urls
    assert np.array_equal(vocab.encode(names), ids)
    # ids unchanged: the dominant URLs first, then one id per other slot in slot order, as before
    n_dominant = len(set(pre.named_urls))
    others = np.ones(hu.ids.size, dtype=bool)
    others[hu.ptr[:n_named]] = False
    assert np.array_equal(hu.ids[others], n_dominant + np.arange(int(others.sum())))
    assert len(hu.named) == n_dominant + int(np.diff(hu.ptr)[:n_named].sum()) - n_named


def test_synthetic_log_decodes_named_secondary_urls() -> None:
    from hybriddp.datasets.synth import generate

    log = generate("aol", seed=1, scale=0.02)
    google = log.queries.encode(["google"])[0]
    urls = np.unique(log.url[log.query == google])
    names = log.urls.decode(urls)
    assert "http://www.google.com" in names and any(n.startswith("http://www.google.com/page") for n in names)
    assert not any(n.startswith("http://www.site") for n in names)
