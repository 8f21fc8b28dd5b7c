"""Parameter validation at construction (ALGORITHM.md §2, §3): errors name the parameter and the range."""

from __future__ import annotations

import math
import sys
from decimal import Decimal, getcontext

import pytest

from hybriddp import BlenderParams, ParameterError
from hybriddp.core.headlist import HeadList
from hybriddp.core.params import check_local_budget, check_seed, head_list_threshold
from hybriddp.core.protocol import keep_probability
from hybriddp.core.reportlaw import LocalAlgParams


def test_paper_defaults_and_threshold() -> None:
    p = BlenderParams()
    assert (p.epsilon, p.delta, p.optin_fraction, p.f_o, p.f_c, p.head_list_size) == (4.0, 1e-5, 0.05, 0.95,
                                                                                        0.85, 50)
    assert p.b_optin == pytest.approx(0.5)
    assert p.tau == pytest.approx(6.7565, abs=5e-5)
    y = BlenderParams.paper_defaults("yandex")
    assert (y.delta, y.optin_fraction, y.head_list_size) == (1e-7, 0.025, 500)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"epsilon": math.log(2)}, "epsilon (--epsilon) = 0.693"),
        ({"epsilon": 0.5}, "> ln 2"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"delta": 1.0}, "delta (--delta) = 1.0"),
        ({"delta": 0.0}, "strictly between 0 and 1"),
        ({"optin_fraction": 0.0}, "optin_fraction (--optin-fraction) = 0.0"),
        ({"f_o": 1.0}, "f_o (--f-o)"),
        ({"f_c": -0.1}, "f_c (--f-c)"),
        ({"head_list_size": 0}, "head_list_size (--head-list-size) = 0"),
        ({"m_o": 0}, "m_o (--m-o)"),
        ({"m_c": 1.5}, "m_c (--m-c) = 1.5"),
    ],
)
def test_bad_parameters_are_named(kwargs: dict, needle: str) -> None:
    with pytest.raises(ParameterError) as info:
        BlenderParams(**kwargs)
    assert needle in str(info.value)
    assert "must be" in str(info.value)


@pytest.mark.parametrize("m_o", [1, 2, 5])
def test_tau_at_least_one_for_all_valid_inputs(m_o: int) -> None:
    # Theorem 1 requires τ ≥ 1. With m_O = 1, τ = 1 − (2/ε)·ln δ > 1 for every δ < 1, so the
    # check in check_head_list_params can only fire for inputs that are rejected earlier.
    for eps in (0.7, 1.0, 4.0, 20.0):
        for delta in (1e-12, 1e-5, 0.5, 0.999):
            assert head_list_threshold(eps, delta, m_o) >= 1.0
            assert BlenderParams(epsilon=eps, delta=delta, m_o=m_o).tau >= 1.0


# ----- the edges of the arithmetic: the largest ε and the smallest f_C that work ---------------------------------
LN_MAX = math.log(sys.float_info.max)  # e^x is a finite double iff x <= 709.78...


@pytest.mark.parametrize(("f_c", "m_c"), [(0.85, 1), (0.5, 1), (0.99, 1), (0.85, 2)])
def test_largest_epsilon_works_and_the_next_overflows(f_c: float, m_c: int) -> None:
    """Up to the bound, LocalAlg's thresholds are finite; a little beyond, e^(ε') itself overflows."""
    share = max(f_c, 1.0 - f_c)
    largest = min(2.0 * LN_MAX, LN_MAX * m_c / share) * (1.0 - 1e-12)
    p = BlenderParams(epsilon=largest, f_c=f_c, m_c=m_c)
    hl = HeadList.from_lists([0, 1, 2], [[0, 1], [2], []])
    lp = LocalAlgParams.build(hl, p.epsilon, p.delta, p.f_c, p.m_c)
    assert math.isfinite(lp.t) and all(math.isfinite(t) for t in lp.tq)
    beyond = largest * (1.0 + 1e-9)
    with pytest.raises(OverflowError):  # the overflow the check prevents: e^(f_C·ε/m_C) or τ's e^(ε/2)
        math.exp(max(share * beyond / m_c, beyond / 2.0))
    with pytest.raises(ParameterError, match=rf"epsilon \(--epsilon\) = .* must be <= {largest / (1 - 1e-12):.2f}"):
        BlenderParams(epsilon=beyond, f_c=f_c, m_c=m_c)


def _exact_denominator(eps: float, delta: float, k: int) -> Decimal:
    """a = (k·t − 1)/(k − 1) with t = (e^ε + (δ/2)(k−1))/(e^ε + k − 1), in 60-digit decimal arithmetic."""
    getcontext().prec = 60
    e = Decimal(eps).exp()
    t = (e + Decimal(delta) / 2 * (k - 1)) / (e + k - 1)
    return (k * t - 1) / (k - 1)


@pytest.mark.parametrize("k", [2, 5, 51, 1000])
def test_smallest_f_c_keeps_the_estimator_denominator_accurate(k: int) -> None:
    """Just above the bound, LocalAlg's denominator a (ALGORITHM.md §6) keeps 3 significant digits in double
    precision for any k; ten thousand times below it, e^ε' rounds to 1 and a is all rounding error."""
    eps, delta = 4.0, 1e-5
    lo = 1e3 * 2.0**-50 / eps  # 3 significant digits; the relative error of a is at most ~2^-50/ε'
    BlenderParams(epsilon=eps, delta=delta, f_c=1.01 * lo)  # accepted
    with pytest.raises(ParameterError, match=r"f_c \(--f-c\) = 2e-14 is not allowed"):
        BlenderParams(epsilon=eps, delta=delta, f_c=2e-14)
    with pytest.raises(ParameterError, match="f_c"):  # 1 − f_C below the bound: the URL budget
        BlenderParams(epsilon=eps, delta=delta, f_c=1.0 - 1e-15)

    def relative_error(f_c: float) -> float:
        eps_q, delta_q = f_c * eps, f_c * delta
        t = keep_probability(eps_q, delta_q, k)
        a = (k * t - 1.0) / (k - 1)
        exact = _exact_denominator(eps_q, delta_q, k)
        return float(abs(Decimal(a) - exact) / exact)

    for factor in (1.01, 1.3, 2.0, 7.0):
        assert relative_error(factor * lo) < 1e-3
    assert relative_error(lo / 1e4) > 0.5


def test_delta_seed_and_records_per_user_limits() -> None:
    with pytest.raises(ParameterError, match=r"delta \(--delta\) = 5e-324"):
        BlenderParams(delta=5e-324)
    BlenderParams(delta=1e-300)
    with pytest.raises(ParameterError, match=r"m_c \(--m-c\) = 101 .*at most 100"):
        BlenderParams(m_c=101)
    with pytest.raises(ParameterError, match=r"m_o \(--m-o\) = 1000"):
        BlenderParams(m_o=1000)
    BlenderParams(m_o=100, m_c=100)
    for bad in (-1, 2**63, 1.5, True):
        with pytest.raises(ParameterError, match="seed"):
            check_seed(bad)  # type: ignore[arg-type]
    for good in (None, 0, 2**63 - 1):
        check_seed(good)


def test_no_url_level_spends_everything_on_the_query() -> None:
    """A log without URLs uses f_C = 1, so its largest ε is ln(max)·m_C, below the one with URLs."""
    check_local_budget(LN_MAX * 0.999, 1.0, 1, url_level=False)
    with pytest.raises(ParameterError, match="no URL level"):
        check_local_budget(LN_MAX * 1.001, 0.85, 1, url_level=False)
    check_local_budget(LN_MAX * 1.001, 0.85, 1)  # with URLs, f_C = 0.85 allows up to ln(max)/0.85
