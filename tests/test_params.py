"""Parameter validation at construction (ALGORITHM.md §2, §3): errors name the parameter and the range."""

from __future__ import annotations

import math

import pytest

from hybriddp import BlenderParams, ParameterError
from hybriddp.params import head_list_threshold


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
