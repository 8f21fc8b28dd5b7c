"""The audit audits the code that ships: a broken library function is caught by ``hybriddp audit``.

Each audited mechanism's adapter calls the library function production calls, looked up on its module at
call time, so patching that function (``monkeypatch.setattr``) changes what the audit measures:

* CreateHeadList's release (ALGORITHM.md §3, §3.3) through
  :func:`hybriddp.curator.mechanisms.create_head_list_with_counts`:
  a release of the *true* counts of the kept records, or of counts with a *fresh* noise draw (not the draw that
  kept the record, ~1.5ε at the near-threshold event), is refuted (ε_lb > ε) for m_O = 1, 2, 3; the
  unpatched function is not. The exact audit's model check (ALGORITHM.md §3.5) refutes both as well;
* EstimateOptinProbabilities (ALGORITHM.md §4) through :func:`hybriddp.curator.mechanisms.estimate_optin_probabilities`;
* LocalAlg (ALGORITHM.md §5) through :func:`hybriddp.device.batch.randomize_batch`, the OLH report through
  :func:`hybriddp.simulation.baselines.olh.olh_perturb`.

Every audit is seeded; the margins are many standard errors wide, so the outcomes are deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hybriddp.audit import exact_audit, make_audit, run_audit
from hybriddp.core.headlist import HeadList, record_keys, split_keys
from hybriddp.core.params import head_list_scale
from hybriddp.curator import mechanisms as curator
from hybriddp.device import batch as randomizer
from hybriddp.simulation.baselines import olh

TRIALS = 50_000
FRESH_TRIALS = 100_000  # the fresh-noise event is rarer on x' (P ≈ 2e-4): twice the trials keep ε_lb well above ε


def _true_counts(query: np.ndarray, url: np.ndarray, hl: HeadList) -> tuple[np.ndarray, np.ndarray]:
    """(entries of the kept records in HL_S, their true counts N(r, D_S))."""
    keys, true = np.unique(record_keys(query, url), return_counts=True)
    q, u = split_keys(keys)
    e = hl.map_records(q, u)
    kept = ~hl.is_wildcard[e]
    return e[kept], true[kept].astype(np.float64)


def releases_true_counts(real: Callable[..., Any]) -> Callable[..., Any]:
    """create_head_list_with_counts that publishes N(r, D_S) instead of N(r, D_S) + Y_r (same keep decisions)."""
    def leaky(query: np.ndarray, url: np.ndarray, **kw: Any) -> tuple[HeadList, np.ndarray]:
        hl, s_counts = real(query, url, **kw)
        e, true = _true_counts(query, url, hl)
        s_counts = s_counts.copy()
        s_counts[e] = true
        return hl, s_counts
    return leaky


def releases_fresh_noise(real: Callable[..., Any]) -> Callable[..., Any]:
    """create_head_list_with_counts that publishes N(r, D_S) + Y'_r with a second, independent draw Y'_r."""
    def fresh(query: np.ndarray, url: np.ndarray, **kw: Any) -> tuple[HeadList, np.ndarray]:
        hl, s_counts = real(query, url, **kw)
        e, true = _true_counts(query, url, hl)
        s_counts = s_counts.copy()
        s_counts[e] = true + kw["noise"].sample(head_list_scale(kw["epsilon"], kw["m_o"]), len(e))
        return hl, s_counts
    return fresh


def _headlist_result(noise: str, seed: int, m_o: int = 1, trials: int = TRIALS):
    spec = make_audit("headlist", trials=trials, noise=noise, m_o=m_o)
    return run_audit(spec, trials, np.random.default_rng(seed))


# ----- CreateHeadList with its released counts -------------------------------------------------------------


@pytest.mark.parametrize(("noise", "m_o"), [("discrete", 1), ("discrete", 2), ("discrete", 3), ("laplace", 1)])
def test_patched_release_of_true_counts_is_caught(monkeypatch: pytest.MonkeyPatch, noise: str, m_o: int) -> None:
    monkeypatch.setattr(curator, "create_head_list_with_counts",
                        releases_true_counts(curator.create_head_list_with_counts))
    res = _headlist_result(noise, 21, m_o)
    assert res.violation
    assert res.epsilon_lower_bound > res.epsilon_claimed + 1.0


@pytest.mark.parametrize(("noise", "m_o"), [("discrete", 1), ("discrete", 2), ("discrete", 3), ("laplace", 1)])
def test_patched_release_with_fresh_noise_is_caught(monkeypatch: pytest.MonkeyPatch, noise: str, m_o: int) -> None:
    """The count carries a second draw: at the threshold its keep decision and its count each give e^{ε/2}
    (ALGORITHM.md §3.3 needs them to be one draw), so the near-threshold event reaches e^{1.5ε}."""
    monkeypatch.setattr(curator, "create_head_list_with_counts",
                        releases_fresh_noise(curator.create_head_list_with_counts))
    res = _headlist_result(noise, 22, m_o, FRESH_TRIALS)
    assert res.violation
    assert res.epsilon_lower_bound > res.epsilon_claimed + 0.5
    assert "near the threshold" in res.best.scenario


@pytest.mark.parametrize(("noise", "m_o"), [("discrete", 1), ("discrete", 2), ("discrete", 3), ("laplace", 1)])
def test_unpatched_library_passes(noise: str, m_o: int) -> None:
    res = _headlist_result(noise, 23, m_o)
    assert not res.violation
    assert 0.85 * res.epsilon_claimed <= res.epsilon_lower_bound <= res.epsilon_claimed


def test_every_headlist_scenario_calls_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of the four scenarios calls create_head_list_with_counts for x and for x' (one block each here)."""
    calls: list[int] = []
    real = curator.create_head_list_with_counts

    def spy(query: np.ndarray, url: np.ndarray, **kw: Any) -> tuple[HeadList, np.ndarray]:
        calls.append(len(query))
        return real(query, url, **kw)

    monkeypatch.setattr(curator, "create_head_list_with_counts", spy)
    spec = make_audit("headlist", trials=1000)
    run_audit(spec, 1000, np.random.default_rng(0))
    assert len(calls) == 2 * len(spec.scenarios) == 8


@pytest.mark.parametrize("patch", ["true counts", "fresh noise"])
@pytest.mark.parametrize("m_o", [1, 3])
def test_exact_audit_model_check_catches_a_patched_release(monkeypatch: pytest.MonkeyPatch, patch: str,
                                                           m_o: int) -> None:
    """The exact audit runs the library on replayed draws: a release that is not ⊥ or N + Y (the draw that kept
    the record) fails its model check, and the exact audit reports a violation."""
    wrap = releases_true_counts if patch == "true counts" else releases_fresh_noise
    monkeypatch.setattr(curator, "create_head_list_with_counts", wrap(curator.create_head_list_with_counts))
    res = exact_audit("headlist", m_o=m_o)
    assert res.violation and not res.model_check["passed"]
    assert res.delta_exact <= res.delta  # the law itself is fine: the code no longer follows it
    assert res.model_check["wrong_released_counts"] > 0 or not res.model_check["draws_as_modelled"]


def test_exact_audit_of_the_unpatched_library_passes() -> None:
    for m_o in (1, 2, 3):
        res = exact_audit("headlist", m_o=m_o)
        assert not res.violation and res.model_check["passed"]
        assert res.model_check["wrong_keep_decisions"] == res.model_check["wrong_released_counts"] == 0


# ----- EstimateOptinProbabilities, LocalAlg, OLH ------------------------------------------------------------


def test_patched_optin_estimates_with_half_the_noise_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """estimate_optin_probabilities drawing its noise at b_T = m_O/ε instead of 2m_O/ε (ε doubled inside)."""
    real = curator.estimate_optin_probabilities

    def half_noise(query: np.ndarray, url: np.ndarray, hl: HeadList, **kw: Any) -> Any:
        return real(query, url, hl, **{**kw, "epsilon": 2.0 * kw["epsilon"]})

    good = run_audit(make_audit("optin-estimate", trials=TRIALS), TRIALS, np.random.default_rng(31))
    assert not good.violation
    monkeypatch.setattr(curator, "estimate_optin_probabilities", half_noise)
    bad = run_audit(make_audit("optin-estimate", trials=TRIALS), TRIALS, np.random.default_rng(31))
    assert bad.violation and bad.epsilon_lower_bound > good.epsilon_claimed + 1.0
    res = exact_audit("optin-estimate")
    assert res.violation and not res.model_check["draws_as_modelled"]


def test_patched_localalg_without_randomization_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """randomize_batch that keeps the true record with probability 1/2 more than it should."""
    real = randomizer.randomize_batch

    def leaky(entries: np.ndarray, hl: HeadList, lp: Any, rng: np.random.Generator | None = None,
              **kw: Any) -> np.ndarray:
        out = real(entries, hl, lp, rng=rng, **kw)
        assert rng is not None
        truthful = rng.random(len(out)) < 0.5
        return np.where(truthful, entries, out)

    monkeypatch.setattr(randomizer, "randomize_batch", leaky)
    res = run_audit(make_audit("localalg", trials=TRIALS), TRIALS, np.random.default_rng(32))
    assert res.violation and res.epsilon_lower_bound > 1.5


def test_patched_olh_with_twice_the_budget_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = olh.olh_perturb

    def greedy(values: np.ndarray, epsilon: float, rng: np.random.Generator, g: int | None = None) -> Any:
        return real(values, 2.0 * epsilon, rng, g)

    monkeypatch.setattr(olh, "olh_perturb", greedy)
    res = run_audit(make_audit("local-only", trials=TRIALS), TRIALS, np.random.default_rng(33))
    assert res.violation and res.epsilon_lower_bound > 1.5
