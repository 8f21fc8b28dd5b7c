"""The exact audit (ALGORITHM.md §3.5): the worst-case hockey-stick divergence of CreateHeadList with its released
counts, checked against independent computations.

* closed forms: at ε = 4 the worst move is one record held m_O times by the user and absent from x', so
  δ(e^ε) = P[m_O + Y > τ_d] = e^{−(τ_d + 1 − m_O)/t}/(1 + e^{−1/t}), t = 2m_O/ε (derived here, not taken from
  the code): 7.3e-7, 1.65e-6, 2.08e-6 for m_O = 1, 2, 3 at δ = 1e-5;
* brute force: Σ_o max(0, P_x(o) − e^ε·P_x'(o)) over the joint output (⊥ or a released value, per record)
  written out from the discrete Laplace pmf, for single moves and for the whole search (m_O = 1 and 2, with
  counts beyond the code's cap), at ε' = ε and at smaller ε' where the finite losses matter;
* Google's dp-accounting: the same per-record output laws as privacy-loss distributions
  (``from_two_probability_mass_functions``), composed; its pessimistic δ lies between the exact δ at ε' and
  at ε' minus its discretization;
* the CLI: ``hybriddp audit --exact``, its JSON, its errors.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from hybriddp.audit.exact import (
    EXACT_MECHANISMS,
    LossLaw,
    exact_audit,
    headlist_delta,
    optin_delta,
    record_loss_law,
)
from hybriddp.cli import cli
from hybriddp.core.headlist import HeadList
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution
from hybriddp.curator import mechanisms as curator

# ----- an independent model of the release ----------------------------------------------------------------


def dlap_pmf(y: np.ndarray, t: float) -> np.ndarray:
    q = math.exp(-1.0 / t)
    return (1 - q) / (1 + q) * q ** np.abs(y)


def output_law(c: int, tau: int | None, t: float, lo: int, hi: int) -> np.ndarray:
    """P[output] of one record with count c over the outcomes [⊥, lo, lo+1, …, hi, "above hi"] (⊥ only with a
    threshold; values below lo are folded into "below lo" when there is no threshold, in slot 0)."""
    ys = np.arange(lo, hi + 1) - c
    vals = dlap_pmf(ys, t)
    width = 3 * (hi - lo) + 400
    if tau is None:
        below = dlap_pmf(np.arange(lo - width, lo) - c, t).sum()
        above = dlap_pmf(np.arange(hi + 1, hi + 1 + width) - c, t).sum()
        return np.concatenate([[below], vals, [above]])
    if c == 0:
        return np.concatenate([[1.0], np.zeros(len(vals) + 1)])
    bottom = dlap_pmf(np.arange(-width - c, tau + 1) - c, t).sum()  # P[c + Y ≤ τ]
    above = dlap_pmf(np.arange(hi + 1, hi + 1 + width) - c, t).sum()
    return np.concatenate([[bottom], vals, [above]])


def brute_delta(moves: list[tuple[int, int]], tau: int | None, t: float, eps: float, span: int = 40) -> float:
    """Σ_o max(0, P_x(o) − e^ε P_x'(o)) over the product of the records' outputs (values up to τ + span, the rest
    merged: a post-processing, so this is at most the exact δ, by less than the merged tail masses)."""
    lo = (tau + 1) if tau is not None else min(min(c, cp) for c, cp in moves) - span
    hi = (tau if tau is not None else max(max(c, cp) for c, cp in moves)) + span
    p, q = np.ones(1), np.ones(1)
    for c, cp in moves:
        p = np.multiply.outer(p, output_law(c, tau, t, lo, hi)).ravel()
        q = np.multiply.outer(q, output_law(cp, tau, t, lo, hi)).ravel()
    return float(np.maximum(p - math.exp(eps) * q, 0.0).sum())


def code_delta(moves: list[tuple[int, int]], tau: int | None, t: float, eps: float) -> float:
    law = record_loss_law(*moves[0], t, tau)
    for mv in moves[1:]:
        law = law.compose(record_loss_law(*mv, t, tau))
    return law.delta(eps)


def tau_d(eps: float, delta: float, m_o: int) -> int:
    """τ_d of ALGORITHM.md §3.2, recomputed here."""
    t = 2 * m_o / eps
    if m_o == 1:
        k = 1
        while math.exp(-k / t) / (1 + math.exp(-1 / t)) > delta / 2:
            k += 1
        return k
    return math.ceil(t * (math.log(math.exp(eps / 2) + m_o - 1) - math.log(delta)))


# ----- closed forms ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [1e-5, 1e-6])
@pytest.mark.parametrize("m_o", [1, 2, 3])
def test_worst_delta_is_the_closed_form(m_o: int, delta: float) -> None:
    eps = 4.0
    t = 2 * m_o / eps  # 0.5, 1, 1.5: the rational scale is exact
    tau = tau_d(eps, delta, m_o)
    expected = math.exp(-(tau + 1 - m_o) / t) / (1 + math.exp(-1 / t))  # P[m_O + Y > τ_d] = P[Y ≥ τ_d + 1 − m_O]
    res = exact_audit("headlist", epsilon=eps, delta=delta, m_o=m_o)
    assert res.details["tau"] == tau and res.details["noise_scale"] == t
    assert res.delta_exact == pytest.approx(expected, rel=1e-12)
    assert res.delta_exact <= delta and not res.violation
    assert res.worst["falling"] == [f"{m_o}->0"]
    assert res.model_check["passed"]


def test_the_check_values_at_the_papers_delta() -> None:
    got = [exact_audit("headlist", m_o=m).delta_exact for m in (1, 2, 3)]
    assert [exact_audit("headlist", m_o=m).details["tau"] for m in (1, 2, 3)] == [7, 14, 21]
    assert got == pytest.approx([math.exp(-14) / (1 + math.exp(-2)),  # P[1 + Y ≥ 8], t = 0.5
                                 math.exp(-13) / (1 + math.exp(-1)),  # P[Y ≥ 13], t = 1
                                 math.exp(-19 / 1.5) / (1 + math.exp(-1 / 1.5))], rel=1e-12)  # P[Y ≥ 19], t = 1.5
    assert got == pytest.approx([7.3e-7, 1.65e-6, 2.08e-6], rel=5e-3)


# ----- brute force ----------------------------------------------------------------------------------------------

MOVES = [
    [(1, 0), (0, 1)], [(1, 0), (7, 8)], [(7, 6), (7, 8)], [(8, 7), (3, 4)], [(2, 1), (0, 1)], [(9, 8), (12, 13)],
    [(2, 0), (5, 7)], [(3, 1), (6, 8)], [(1, 0), (1, 0), (6, 8)], [(2, 1), (6, 5), (3, 4), (0, 1)],
    [(3, 0), (7, 10)], [(4, 2), (1, 0), (5, 6), (5, 7)],
]


@pytest.mark.parametrize("moves", MOVES)
def test_one_move_matches_brute_force(moves: list[tuple[int, int]]) -> None:
    """ε = 4, δ = 0.05, m_O = 3 (t = 1.5, τ_d = 7): the composed loss law gives the brute-force δ at several ε'."""
    t, tau = 1.5, 7
    for eps in (4.0, 3.0, 2.0, 1.0, 0.3):
        assert code_delta(moves, tau, t, eps) == pytest.approx(brute_delta(moves, tau, t, eps), rel=1e-9, abs=1e-15)


def test_search_matches_brute_force_m1() -> None:
    """m_O = 1, ε = 4, δ = 1e-5: the maximum over every falling and rising record, counts 0 … τ_d + 3 (beyond the
    code's cap of τ_d), brute force, equals the search, at the claimed ε and below it."""
    tau, t = 7, 0.5
    for eps in (4.0, 3.9, 3.0, 1.0):
        brute = max(brute_delta([(cp + 1, cp), (c, c + 1)], tau, t, eps)
                    for cp in range(tau + 4) for c in range(tau + 4))
        assert headlist_delta(4.0, 1e-5, 1, eps)[0].delta == pytest.approx(brute, rel=1e-9, abs=1e-15)


def test_search_matches_brute_force_m2() -> None:
    """m_O = 2, ε = 4, δ = 0.2 (t = 1, τ_d = 4): every move of 2 units — a record held twice (−2) or two records
    (−1, −1), and the same rises — with counts 0 … τ_d + 1 on each record's smaller side, brute force."""
    eps, delta, t = 4.0, 0.2, 1.0
    tau = tau_d(eps, delta, 2)
    assert headlist_delta(eps, delta, 2)[1]["tau"] == tau == 4
    counts = range(tau + 2)
    falls = [[(cp + 2, cp)] for cp in counts] + [[(a + 1, a), (b + 1, b)]
                                                 for a, b in itertools.combinations_with_replacement(counts, 2)]
    rises = [[(c, c + 2)] for c in counts] + [[(a, a + 1), (b, b + 1)]
                                              for a, b in itertools.combinations_with_replacement(counts, 2)]
    for e in (4.0, 2.5):
        brute = max(brute_delta(f + r, tau, t, e, span=24) for f in falls for r in rises)
        assert headlist_delta(eps, delta, 2, e)[0].delta == pytest.approx(brute, rel=1e-8, abs=1e-15)


def test_large_counts_have_one_loss_law() -> None:
    """The search stops at τ_d on a record's smaller side: beyond it the loss law no longer changes."""
    t, tau = 1.0, 14
    for s in (1, 2, 3):
        ref_fall, ref_rise = record_loss_law(tau + s, tau, t, tau), record_loss_law(tau, tau + s, t, tau)
        for extra in (1, 5, 30):
            for ref, law in ((ref_fall, record_loss_law(tau + s + extra, tau + extra, t, tau)),
                             (ref_rise, record_loss_law(tau + extra, tau + s + extra, t, tau))):
                assert _grouped(law) == pytest.approx(_grouped(ref), rel=1e-9, abs=1e-300)
                assert law.p_inf == ref.p_inf == 0.0


def _grouped(law: LossLaw) -> dict[float, float]:
    """The law's masses by loss rounded to 1e-9 (⊥'s loss, a difference of logarithms, and the values' loss, an
    integer over t, are the same number up to rounding)."""
    out: dict[float, float] = {}
    for loss, p in zip(np.round(law.loss, 9).tolist(), law.prob.tolist(), strict=True):
        out[loss] = out.get(loss, 0.0) + p
    return out


def test_optin_counts_are_pure_epsilon() -> None:
    """EstimateOptinProbabilities (no threshold): δ(e^ε) = 0 for m_O = 1, 2, 3, and the brute-force δ below ε."""
    for m_o in (1, 2, 3):
        worst, details = optin_delta(4.0, m_o)
        assert worst.delta == 0.0 and details["max_finite_loss"] == pytest.approx(4.0)
        t = 2 * m_o / 4.0
        below = optin_delta(4.0, m_o, 3.0)[0]
        moves = list(below.falling) + list(below.rising)
        assert below.delta == pytest.approx(brute_delta(moves, None, t, 3.0, span=60), rel=1e-9)
        assert not exact_audit("optin-estimate", m_o=m_o).violation


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-5), (4.0, 1e-5), (0.5, 0.2)])
def test_localalg_exact(eps: float, delta: float) -> None:
    """LocalAlg on the audit's head list (3 queries of 2 URLs: k = 4, k_q = 3): δ(e^ε) ≤ δ, equal to the
    hockey-stick divergence written out here, and (δ negligible) its largest loss is the closed form
    ε'_Q + ln(3e^{ε'_U}/(e^{ε'_U} + 2)) of ALGORITHM.md §5."""
    res = exact_audit("localalg", epsilon=eps, delta=delta)
    assert not res.violation and res.delta_exact <= delta
    assert res.worst["x"] != res.worst["x_prime"]
    hl = HeadList.from_lists([0, 1, 2], [[0, 1], [2, 3], [4, 5]])
    P = output_distribution(LocalAlgParams.build(hl, eps, delta, 0.85, 1))
    brute = max(float(np.maximum(P[i] - math.exp(eps) * P[j], 0.0).sum())
                for i in range(len(P)) for j in range(len(P)) if i != j)
    assert res.delta_exact == pytest.approx(brute, abs=1e-15)
    if delta == 1e-5:
        eps_q, eps_u = 0.85 * eps, 0.15 * eps
        closed = eps_q + math.log(3 * math.exp(eps_u) / (math.exp(eps_u) + 2))
        assert res.details["max_finite_loss"] == pytest.approx(closed, abs=1e-4)


# ----- dp-accounting ----------------------------------------------------------------------------------------------


def pld_of(moves: list[tuple[int, int]], tau: int, t: float, interval: float) -> Any:
    """Per-record PLDs from the output laws (x upper, x' lower), composed by dp-accounting (a test dependency,
    imported here so that the other tests of this file run without it)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    lo, hi = tau + 1, tau + 60
    total = None
    for c, cp in moves:
        def log_pmf(count: int) -> dict[object, float]:
            law = output_law(count, tau, t, lo, hi)
            return {o: math.log(p) for o, p in zip(["bot", *range(lo, hi + 1), "above"], law, strict=True) if p > 0}
        one = pld.from_two_probability_mass_functions(log_pmf(cp), log_pmf(c), value_discretization_interval=interval)
        total = one if total is None else total.compose(one)
    assert total is not None
    return total


@pytest.mark.parametrize("m_o", [1, 2, 3])
def test_dp_accounting_agrees(m_o: int) -> None:
    """dp-accounting's pessimistic δ of the worst move (at ε) and of the worst move at ε' = 3.5 lies between the
    exact δ at ε' and at ε' − kΔ (each of the k records' losses is rounded up by less than Δ)."""
    eps, delta, interval = 4.0, 1e-5, 1e-6
    for at in (4.0, 3.5):
        worst, details = headlist_delta(eps, delta, m_o, at)
        moves = list(worst.falling) + list(worst.rising)
        tau, t = details["tau"], details["noise_scale"]
        got = pld_of(moves, tau, t, interval).get_delta_for_epsilon(at)
        k = len(moves)
        assert code_delta(moves, tau, t, at) == pytest.approx(worst.delta, rel=1e-12)
        assert worst.delta * (1 - 1e-9) <= got <= code_delta(moves, tau, t, at - k * interval) * (1 + 1e-9) + 1e-15
    assert headlist_delta(eps, delta, m_o)[0].delta == pytest.approx(
        pld_of([(m_o, 0)], details["tau"], details["noise_scale"], interval).get_delta_for_epsilon(eps), rel=1e-9)


def test_dp_accounting_search_m1() -> None:
    """m_O = 1: the largest dp-accounting δ over every falling and rising record (counts 0 … τ_d on the smaller
    side) matches the search's worst δ, at the claimed ε and below it."""
    tau, t, interval = 7, 0.5, 1e-6
    moves = [[(cp + 1, cp), (c, c + 1)] for cp in range(tau + 1) for c in range(tau + 1)]
    plds = [pld_of(mv, tau, t, interval) for mv in moves]
    for at in (4.0, 3.5, 2.0):
        best = max(p.get_delta_for_epsilon(at) for p in plds)
        assert best == pytest.approx(headlist_delta(4.0, 1e-5, 1, at)[0].delta, rel=1e-5)


# ----- the CLI ----------------------------------------------------------------------------------------------------


def _invoke(*args: str):
    return CliRunner().invoke(cli, ["audit", *args])


@pytest.mark.parametrize("m_o", ["1", "2", "3"])
def test_cli_exact_json(m_o: str) -> None:
    r = _invoke("--exact", "--mechanism", "headlist", "--m-o", m_o, "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    for key in ("mechanism", "mode", "epsilon_claimed", "delta", "delta_exact", "violation", "m_o", "worst",
                "details", "model_check"):
        assert key in obj
    assert obj["mode"] == "exact" and obj["epsilon_claimed"] == 4.0 and obj["delta"] == 1e-5
    assert obj["m_o"] == int(m_o) and obj["violation"] is False and 0 < obj["delta_exact"] <= 1e-5
    assert obj["model_check"]["passed"] is True


def test_cli_exact_text_and_other_mechanisms() -> None:
    r = _invoke("--exact", "--mechanism", "headlist", "--delta", "1e-6", "--m-o", "2")
    assert r.exit_code == 0, r.output
    assert "exact delta(e^epsilon)" in r.stdout and "1e-06" in r.stdout and "no violation" in r.stdout
    for mech in ("optin-estimate", "localalg"):
        r = _invoke("--exact", "--mechanism", mech, "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["delta_exact"] == 0.0
    assert set(EXACT_MECHANISMS) == {"headlist", "optin-estimate", "localalg"}


def test_cli_exact_violation_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    real = curator.create_head_list_with_counts

    def off_by_one(query: np.ndarray, url: np.ndarray, **kw: object):
        hl, s = real(query, url, **kw)
        return hl, np.where(np.isnan(s), s, s + 1.0)  # not the draw that kept the record

    monkeypatch.setattr(curator, "create_head_list_with_counts", off_by_one)
    r = _invoke("--exact", "--mechanism", "headlist")
    assert r.exit_code == 1 and "VIOLATION" in r.stdout


@pytest.mark.parametrize(("args", "field"), [
    (("--mechanism", "headlist", "--m-o", "4"), "m_o (--m-o) = 4"),
    (("--mechanism", "headlist", "--delta", "0"), "delta (--delta) = 0.0"),
    (("--mechanism", "headlist", "--delta", "-1e-5"), "delta (--delta) = -1e-05"),
    (("--mechanism", "headlist", "--noise", "laplace"), "noise (--noise) = 'laplace'"),
    (("--mechanism", "local-only",), "mechanism (--mechanism) = 'local-only'"),
    (("--mechanism", "localalg", "--m-o", "2"), "m_o (--m-o) = 2"),
    (("--mechanism", "headlist", "--epsilon", "0.5"), "epsilon (--epsilon) = 0.5"),
    (("--mechanism", "optin-estimate", "--delta", "1.5"), "delta (--delta) = 1.5"),
])
def test_cli_exact_bad_input_is_one_line_exit_2(args: tuple[str, ...], field: str) -> None:
    r = _invoke("--exact", *args)
    assert r.exit_code == 2, r.output
    text = (r.stderr or r.output).strip()
    assert len(text.splitlines()) == 1 and text.startswith("error: ") and field in text, text


def test_cli_sampling_m_o_and_help() -> None:
    r = _invoke("--mechanism", "headlist", "--m-o", "2", "--trials", "20000", "--seed", "1", "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["details"]["m_o"] == 2 and obj["violation"] is False
    assert obj["details"]["adapter"] == "hybriddp.curator.mechanisms.create_head_list_with_counts"
    r = _invoke("--mechanism", "headlist", "--m-o", "0", "--trials", "1000")
    assert r.exit_code == 2 and "m_o (--m-o) = 0" in (r.stderr or r.output)
    r = _invoke("--help")
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    for opt in ("--mechanism", "--exact", "--m-o", "--epsilon", "--delta", "--trials", "--confidence", "--noise",
                "--f-c", "--seed", "--json"):
        assert opt in text
    assert "1e-5" in text and "Default: 1." in text and "[default: 1000000]" in text


def test_loss_law_delta_of_infinite_mass() -> None:
    law = LossLaw.of([(0.0, 0.75)], p_inf=0.25)
    assert law.delta(4.0) == 0.25 and law.compose(law).delta(4.0) == pytest.approx(1 - 0.75**2)
