"""The empirical privacy audit (issue "Privacy assurance"): bounds, power, a caught bug, the CLI.

Every audit is seeded, so the assertions are deterministic; the margins were chosen so that they
also hold for other seeds with overwhelming probability (the lower bounds sit several standard
errors away from each threshold).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from hybriddp.audit import (
    MECHANISMS,
    MechanismAudit,
    Scenario,
    beta_ppf,
    betainc,
    clopper_pearson_lower,
    clopper_pearson_upper,
    head_list_release,
    headlist_audit,
    localalg_audit,
    make_audit,
    optin_release,
    run_audit,
)
from hybriddp.cli import cli
from hybriddp.core.errors import ParameterError
from hybriddp.core.headlist import HeadList
from hybriddp.core.noise import discrete_laplace_pmf, noise_factory
from hybriddp.core.protocol import budget_split, keep_probability
from hybriddp.core.reportlaw import LocalAlgParams, output_distribution, privacy_loss_delta

# ----- Clopper–Pearson without SciPy, checked against SciPy ---------------------------------------


@pytest.mark.parametrize(("a", "b", "x"), [(1, 1, 0.3), (5, 1e6, 3e-6), (1.6e5, 8.4e5, 0.16), (0.5, 2.5, 0.9),
                                           (3, 7, 0.5), (8.4e5, 1.6e5, 0.83)])
def test_betainc_matches_scipy(a: float, b: float, x: float) -> None:
    # rel 1e-7: log B(a, b) from lgamma of ~10^6 loses ~1e-9 (irrelevant for a confidence bound)
    assert betainc(a, b, x) == pytest.approx(stats.beta.cdf(x, a, b), rel=1e-7, abs=1e-300)
    q = 0.37
    assert beta_ppf(q, a, b) == pytest.approx(stats.beta.ppf(q, a, b), rel=1e-7)


@pytest.mark.parametrize("n", [1, 7, 1000, 10**6])
@pytest.mark.parametrize("alpha", [0.01, 1e-4])
def test_clopper_pearson_matches_scipy(n: int, alpha: float) -> None:
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
        lo, hi = clopper_pearson_lower(k, n, alpha), clopper_pearson_upper(k, n, alpha)
        ref_lo = stats.beta.ppf(alpha, k, n - k + 1) if k > 0 else 0.0
        ref_hi = stats.beta.ppf(1 - alpha, k + 1, n - k) if k < n else 1.0
        assert lo == pytest.approx(ref_lo, rel=1e-7, abs=1e-15)
        assert hi == pytest.approx(ref_hi, rel=1e-7, abs=1e-15)
        assert lo <= k / n <= hi


# ----- every mechanism: the bound stays below the claim, with some power ------------------------

CASES = [("localalg", "discrete"), ("headlist", "discrete"), ("headlist", "laplace"),
         ("optin-estimate", "discrete"), ("optin-estimate", "laplace"), ("local-only", "discrete")]


@pytest.mark.parametrize(("mechanism", "noise"), CASES)
def test_lower_bound_does_not_exceed_claim(mechanism: str, noise: str) -> None:
    trials = 200_000
    spec = make_audit(mechanism, trials=trials, noise=noise)
    res = run_audit(spec, trials, np.random.default_rng(11), confidence=0.99)
    assert 0.0 <= res.epsilon_lower_bound <= res.epsilon_claimed
    assert res.delta_lower_bound <= res.delta
    assert not res.violation
    assert res.epsilon_lower_bound >= 0.7 * res.epsilon_claimed  # the chosen events have power
    # the best of the scenarios' closed forms (headlist also has the released counts' one)
    assert res.epsilon_lower_bound <= max(cf["epsilon_event"] for key, cf in spec.details.items()
                                          if key.startswith("closed_form"))
    assert len(res.tests) == 4 * len(spec.scenarios)


@pytest.mark.parametrize(("mechanism", "noise"), CASES)
def test_event_frequencies_match_closed_form(mechanism: str, noise: str) -> None:
    """The adapters' event frequencies agree with the closed forms the events were chosen from."""
    trials = 100_000
    spec = make_audit(mechanism, trials=trials, noise=noise)
    res = run_audit(spec, trials, np.random.default_rng(5))
    first = res.tests[0]  # E on x vs x' of the first scenario
    cf = spec.details["closed_form"]
    for k, p in ((first.count_x, cf["p_x"]), (first.count_x_prime, cf["p_x_prime"])):
        se = math.sqrt(p * (1 - p) / trials)
        assert abs(k / trials - p) <= 5 * se + 1e-12, (k / trials, p)


def test_localalg_power_at_a_million_trials() -> None:
    """ε = 1: the optimal event (report = x, x' of another query) has ε_E ≈ 0.947; 10^6 trials get ≥ 0.9."""
    res = run_audit(localalg_audit(1.0, 1e-5, trials=10**6), 10**6, np.random.default_rng(2))
    assert res.epsilon_lower_bound >= 0.7 * 1.0
    assert 0.9 <= res.epsilon_lower_bound <= 1.0
    assert res.best.event == "report in {<q0,u0>}"


def test_localalg_event_is_the_closed_form_worst_case() -> None:
    spec = localalg_audit(1.0, 1e-5)
    lp = LocalAlgParams.build(HeadList.from_lists([0, 1, 2], [[0, 1], [2, 3], [4, 5]]), 1.0, 1e-5, 0.85, 1)
    P = output_distribution(lp)
    eps_q, _, eps_u, _ = budget_split(1.0, 1e-5, 0.85, 1)
    max_loss = float(np.log((P[:, None, :] / P[None, :, :]).max()))
    assert max_loss == pytest.approx(eps_q + math.log(3 * math.exp(eps_u) / (math.exp(eps_u) + 2)), rel=1e-4)
    assert spec.details["closed_form"]["epsilon_event"] == pytest.approx(max_loss, abs=1e-3)
    assert spec.scenarios[0].x == "<q0,u0>" and not spec.scenarios[0].x_prime.startswith("<q0,")


def test_broken_localalg_is_caught() -> None:
    """t computed with ε' instead of f_C·ε' (Fig. 6 line 4 bug): the audit proves ε > claimed."""
    hl = HeadList.from_lists([0, 1, 2], [[0, 1], [2, 3], [4, 5]])
    good = LocalAlgParams.build(hl, 1.0, 1e-5, 0.85, 1)
    _, delta_q, _, _ = budget_split(1.0, 1e-5, 0.85, 1)
    t = keep_probability(1.0, delta_q, hl.k)  # the bug
    broken = LocalAlgParams(good.k, good.kq, t, good.tq, 1.0 - t, good.one_minus_tq)
    assert privacy_loss_delta(output_distribution(broken), 1.0) > 1e-5  # really not (1, 1e-5)-LDP
    res = run_audit(localalg_audit(1.0, 1e-5, lp=broken), 10**6, np.random.default_rng(3))
    assert res.epsilon_lower_bound > 1.0
    assert res.violation
    good_res = run_audit(localalg_audit(1.0, 1e-5), 10**6, np.random.default_rng(3))
    assert good_res.epsilon_lower_bound < 1.0


@pytest.mark.parametrize("m_o", [1, 2, 3])
def test_headlist_delta_is_measured_and_not_exceeded(m_o: int) -> None:
    """The δ-dominated pair (r held m_O times vs absent): ε_lb is 0 whatever δ, δ_lb is positive and ≤ δ, and the
    event's frequency matches its closed form P[m_O + Y > τ_d] ≤ δ/2 (5 standard errors)."""
    trials = 400_000
    spec = headlist_audit(4.0, 1e-2, trials=trials, m_o=m_o)
    presence = spec.scenarios[1]
    assert presence.name.startswith("r present")
    res = run_audit(MechanismAudit("headlist", 4.0, 1e-2, (presence,), spec.details), trials,
                    np.random.default_rng(4))
    assert all(r.epsilon_lower_bound == 0.0 for r in res.tests)
    assert 0.0 < res.delta_lower_bound <= 1e-2
    p = spec.details["presence_survival"]
    assert p <= 1e-2 / 2
    k = res.tests[0].count_x
    assert abs(k / trials - p) <= 5 * math.sqrt(p / trials)
    assert res.tests[0].count_x_prime == 0


# ----- the adapters run the library and read its release back ----------------------------------


class ReplayNoise:
    """A noise source that hands out given draws (and the real source's threshold and variance)."""

    def __init__(self, real: object, draws: np.ndarray) -> None:
        self.real = real
        self.name = real.name  # type: ignore[attr-defined]
        self.draws = list(np.asarray(draws, dtype=np.float64))

    def sample(self, scale: float, size: int) -> np.ndarray:
        out, self.draws = self.draws[:size], self.draws[size:]
        return np.array(out + [0.0] * (size - len(out)))

    def variance(self, scale: float) -> float:
        return self.real.variance(scale)  # type: ignore[attr-defined]

    def survival(self, x: float, scale: float) -> float:
        return self.real.survival(x, scale)  # type: ignore[attr-defined]

    def head_list_threshold(self, epsilon: float, delta: float, m_o: int) -> float:
        return self.real.head_list_threshold(epsilon, delta, m_o)  # type: ignore[attr-defined]


@pytest.mark.parametrize("noise", ["discrete", "laplace"])
@pytest.mark.parametrize("m_o", [1, 2])
def test_head_list_release_is_the_library_release_trial_by_trial(monkeypatch: pytest.MonkeyPatch, noise: str,
                                                                m_o: int) -> None:
    """create_head_list_with_counts on the disjoint copies releases, for trial i, N(r) + Y_r of each record r with
    N(r) + Y_r > τ and nothing for the others (ALGORITHM.md §3.3), one draw per present record in trial order;
    a record of count 0 is never released. Small blocks, so several library calls share the draws."""
    import hybriddp.audit.curator as audit_curator

    monkeypatch.setattr(audit_curator, "BLOCK_ROWS", 50)
    eps, delta, trials = 4.0, 1e-2, 400
    real = noise_factory(noise)(np.random.default_rng(3))
    tau = real.head_list_threshold(eps, delta, m_o)
    counts = np.array([math.floor(tau), 0, math.floor(tau) + 2])
    draws = real.sample(2.0 * m_o / eps, 2 * trials).reshape(trials, 2)  # records 0 and 2 of each trial
    out = head_list_release(counts, trials, ReplayNoise(real, draws.ravel()), epsilon=eps, delta=delta, m_o=m_o)
    noisy = counts[[0, 2]] + draws
    np.testing.assert_array_equal(out[:, [0, 2]], np.where(noisy > tau, noisy, np.nan))
    assert np.isnan(out[:, 1]).all()
    assert 0 < np.isnan(out[:, 0]).sum() < trials and 0 < np.isnan(out[:, 2]).sum() < trials  # both branches


@pytest.mark.parametrize("noise", ["discrete", "laplace"])
def test_optin_release_is_the_library_release_trial_by_trial(monkeypatch: pytest.MonkeyPatch, noise: str) -> None:
    """estimate_optin_probabilities on the disjoint copies gives N̂ = p̂_O·|D_T| = N(r) + Y_r for every record, one
    draw per HL_S entry in entry order (the trials' URLs, then ⟨0,*⟩ and ⟨*,*⟩), several blocks."""
    import hybriddp.audit.curator as audit_curator

    monkeypatch.setattr(audit_curator, "BLOCK_ROWS", 60)
    eps, trials, block = 4.0, 300, 20  # 60 // (1 + 2) = 20 trials per block
    real = noise_factory(noise)(np.random.default_rng(4))
    draws = real.sample(0.5, 2 * trials).reshape(trials // block, 2 * block)
    per_block = np.concatenate([draws, np.zeros((trials // block, 2))], axis=1).ravel()  # + the two wildcards
    out = optin_release(np.array([1, 0]), trials, ReplayNoise(real, per_block), epsilon=eps, m_o=1,
                        integer=noise == "discrete")
    expected = np.array([1.0, 0.0]) + draws.reshape(trials, 2)
    if noise == "discrete":
        np.testing.assert_array_equal(out, expected)
    else:
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)


def _released_counts_closed_form(noise: str, counts: tuple[int, int], s: int, s2: int, tau: float,
                                 b: float) -> float:
    """P[E] from the noise's own law, independently of the audit code: discrete Laplace pmf summed over a
    wide window, or SciPy's Laplace cdf."""
    c1, c2 = counts
    if noise == "discrete":
        y = np.arange(-400, 401)
        pmf = discrete_laplace_pmf(y, b)
        r1 = pmf[(c1 + y > tau) & (c1 + y >= s)].sum()
        r2 = pmf[(c2 + y <= tau) | (c2 + y <= s2)].sum()
        return float(r1 * r2)
    r1 = stats.laplace.sf(max(tau, s) - c1, scale=b)
    r2 = stats.laplace.cdf(max(tau, s2) - c2, scale=b)
    return float(r1 * r2)


@pytest.mark.parametrize("noise", ["discrete", "laplace"])
def test_released_counts_event_matches_closed_form(noise: str) -> None:
    """The closed form of the released-counts event agrees with an independent computation and with the
    adapter's event frequencies (5 standard errors)."""
    trials = 200_000
    spec = headlist_audit(4.0, 1e-2, noise=noise, trials=trials)
    d = spec.details
    cf = d["closed_form_counts"]
    s, s2 = d["released_count_thresholds"]
    for counts, p in ((d["released_counts_x"], cf["p_x"]), (d["released_counts_x_prime"], cf["p_x_prime"])):
        assert p == pytest.approx(_released_counts_closed_form(noise, tuple(counts), s, s2, d["tau"], d["b"]),
                                  rel=1e-9)
    assert cf["epsilon_event"] == pytest.approx(math.log((cf["p_x"] - 1e-2) / cf["p_x_prime"]))
    assert cf["epsilon_event"] <= 4.0
    released = spec.scenarios[2]
    out_x, out_xp = released.adapter(np.random.default_rng(14), trials)
    for out, p in ((out_x, cf["p_x"]), (out_xp, cf["p_x_prime"])):
        k = int(np.count_nonzero(released.events[0].indicator(out)))
        assert abs(k / trials - p) <= 5 * math.sqrt(p * (1 - p) / trials), (k / trials, p)


@pytest.mark.parametrize("noise", ["discrete", "laplace"])
def test_released_counts_bound_does_not_exceed_claim(noise: str) -> None:
    """The released counts stay within (ε, δ), and the event has power: with Laplace noise the counts
    prove more than the keep decisions alone can (their best event's exact ε is 3.72 at ε = 4)."""
    trials = 300_000
    spec = headlist_audit(4.0, 1e-2, noise=noise, trials=trials)
    released = MechanismAudit("headlist", 4.0, 1e-2, (spec.scenarios[2],), spec.details)
    res = run_audit(released, trials, np.random.default_rng(15))
    assert not res.violation
    assert 0.9 * 4.0 <= res.epsilon_lower_bound <= spec.details["closed_form_counts"]["epsilon_event"] <= 4.0
    assert res.delta_lower_bound <= 1e-2
    if noise == "laplace":
        assert res.epsilon_lower_bound > spec.details["closed_form"]["epsilon_event"]


@pytest.mark.parametrize("noise", ["discrete", "laplace"])
def test_releasing_true_counts_is_caught(noise: str) -> None:
    """A broken release that publishes a kept record's true count N(r) instead of N(r) + Y_r (same keep
    decisions) is refuted by the scenario's own event: ε_lb > ε and δ_lb > δ."""
    trials = 100_000
    spec = headlist_audit(4.0, 1e-2, noise=noise, trials=trials)
    honest = spec.scenarios[2]
    true_x = np.array(spec.details["released_counts_x"], dtype=np.float64)
    true_xp = np.array(spec.details["released_counts_x_prime"], dtype=np.float64)

    def leaky(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        out_x, out_xp = honest.adapter(rng, n)
        return np.where(np.isnan(out_x), np.nan, true_x), np.where(np.isnan(out_xp), np.nan, true_xp)

    broken = Scenario(honest.name, honest.x, honest.x_prime, leaky, honest.events)
    res = run_audit(MechanismAudit("headlist", 4.0, 1e-2, (broken,), spec.details), trials,
                    np.random.default_rng(16))
    assert res.violation
    assert res.epsilon_lower_bound > 4.0 and res.delta_lower_bound > 1e-2
    good = run_audit(MechanismAudit("headlist", 4.0, 1e-2, (honest,), spec.details), trials,
                     np.random.default_rng(16))
    assert not good.violation


# ----- arguments and the CLI -----------------------------------------------------------------------


def test_bad_arguments_raise_parameter_errors() -> None:
    with pytest.raises(ParameterError, match="trials"):
        run_audit(localalg_audit(), 0, np.random.default_rng(0))
    with pytest.raises(ParameterError, match="epsilon"):
        make_audit("headlist", epsilon=0.5)
    with pytest.raises(ParameterError, match="mechanism"):
        make_audit("nope")
    with pytest.raises(ParameterError, match="delta"):
        make_audit("local-only", delta=-1.0)


def _invoke(*args: str):
    return CliRunner().invoke(cli, ["audit", *args])


def test_cli_json() -> None:
    r = _invoke("--mechanism", "local-only", "--trials", "50000", "--seed", "1", "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    for key in ("epsilon_claimed", "epsilon_lower_bound", "mechanism", "trials", "delta", "event", "count_x",
                "count_x_prime", "confidence", "delta_lower_bound", "tests", "violation"):
        assert key in obj
    assert obj["mechanism"] == "local-only" and obj["trials"] == 50_000 and obj["confidence"] == 0.99
    assert obj["epsilon_claimed"] == 1.0 and obj["delta"] == 0.0
    assert 0.5 < obj["epsilon_lower_bound"] <= 1.0 and obj["violation"] is False


def test_cli_text() -> None:
    r = _invoke("--mechanism", "localalg", "--trials", "20000", "--seed", "1")
    assert r.exit_code == 0, r.output
    assert "lower bound" in r.stdout and "claimed" in r.stdout and "no violation" in r.stdout


@pytest.mark.parametrize("args", [("--trials", "0"), ("--epsilon", "0.5", "--mechanism", "headlist"),
                                  ("--confidence", "1.5")])
def test_cli_bad_argument_is_one_line_exit_2(args: tuple[str, ...]) -> None:
    if "--mechanism" not in args:
        args = ("--mechanism", "localalg", *args)
    r = _invoke(*args)
    assert r.exit_code == 2, r.output
    text = (r.stderr or r.output).strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1 and text.startswith("error:")


def test_mechanism_names_are_the_cli_choices() -> None:
    assert MECHANISMS == ("localalg", "headlist", "optin-estimate", "local-only")
