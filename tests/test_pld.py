"""Privacy-loss-distribution accounting over rounds (hybriddp.audit.pld, ALGORITHM.md §14): each round's PLD
dominates the exact privacy profile the audit computes, at every ε and not only on its grid; it agrees with
dp-accounting's own discrete Laplace mechanism where the two describe the same pair; composition is never looser
than basic composition; and the command."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from hybriddp.audit.exact import headlist_delta, optin_delta
from hybriddp.audit.pld import (
    DISCRETIZATION,
    Mechanism,
    admitted_rounds,
    compose,
    grid,
    localalg_delta,
    localalg_law,
    round_mechanism,
    round_pld,
    totals,
)
from hybriddp.cli import cli
from hybriddp.core.errors import ParameterError
from hybriddp.core.reportlaw import output_distribution, privacy_loss_delta


def _exact(mech: Mechanism, eps: float) -> float:
    if mech.kind == "local":  # brute force: every pair of records of the closed-form law
        return privacy_loss_delta(output_distribution(localalg_law(mech)), eps)
    if mech.kind == "headlist":
        return headlist_delta(mech.epsilon, mech.delta, mech.m_o, at_epsilon=eps)[0].delta
    return optin_delta(mech.epsilon, mech.m_o, at_epsilon=eps)[0].delta


@pytest.mark.parametrize("mech", [Mechanism("headlist", 4.0, 1e-5, 1), Mechanism("headlist", 4.0, 1e-5, 2),
                                  Mechanism("headlist", 1.0, 1e-6, 1), Mechanism("optin", 4.0, 0.0, 1),
                                  Mechanism("optin", 2.0, 0.0, 3),
                                  Mechanism("local", 4.0, 1e-5, kq=(3, 3, 2, 1, 1), f_c=0.85),
                                  Mechanism("local", 1.0, 1e-6, kq=(4, 2, 2, 1), f_c=0.6)])
def test_a_round_pld_dominates_the_exact_profile_everywhere(mech: Mechanism) -> None:
    """δ_PLD(ε) ≥ the exact worst δ(ε) over every move at 301 points from below −L to above L, most of them off the
    connect-the-dots grid; at the grid's points the two agree (the PLD is as tight as its grid allows)."""
    pld = round_pld(mech)
    if mech.kind == "local":
        from hybriddp.audit.pld import _localalg_max_loss
        big_l = _localalg_max_loss(localalg_law(mech))
    else:
        _, details = (headlist_delta(mech.epsilon, mech.delta, mech.m_o) if mech.kind == "headlist"
                      else optin_delta(mech.epsilon, mech.m_o))
        big_l = details["max_finite_loss"]
    for eps in np.linspace(-big_l - 1.0, big_l + 1.0, 301):
        assert pld.get_delta_for_epsilon(float(eps)) >= _exact(mech, float(eps)) - 1e-12, eps
    for r in grid(big_l)[::20]:
        eps = float(r) * DISCRETIZATION
        assert pld.get_delta_for_epsilon(eps) == pytest.approx(_exact(mech, eps), abs=1e-9), eps


def test_an_opt_in_user_in_s_or_t_is_dominated_by_the_larger_profile() -> None:
    """The service charges an opt-in user before the split (``optin-any``): its PLD's δ(ε) is at least both exact
    profiles' everywhere, and equals the larger one at the grid's points."""
    for eps_round, delta in ((4.0, 1e-5), (1.0, 1e-6)):
        either = round_pld(Mechanism("optin-any", eps_round, delta, 1))
        parts = [Mechanism("headlist", eps_round, delta, 1), Mechanism("optin", eps_round, delta, 1)]
        big_l = max(headlist_delta(eps_round, delta, 1)[1]["max_finite_loss"],
                    optin_delta(eps_round, 1)[1]["max_finite_loss"])
        for eps in np.linspace(-big_l - 1.0, big_l + 1.0, 121):
            worst = max(_exact(m, float(eps)) for m in parts)
            assert either.get_delta_for_epsilon(float(eps)) >= worst - 1e-12, eps
        for r in grid(big_l)[::30]:
            eps = float(r) * DISCRETIZATION
            worst = max(_exact(m, eps) for m in parts)
            assert either.get_delta_for_epsilon(eps) == pytest.approx(worst, abs=1e-9), eps


def test_the_opt_in_pld_is_dp_accountings_discrete_laplace_pair() -> None:
    """With m_O = 1 the worst move shifts one record's count down and another's up by one, each under discrete
    Laplace noise of scale t: dp-accounting's own discrete Laplace mechanism (parameter 1/t, sensitivity 1), twice.
    Twelve rounds of either give the same ε at δ = 1e-6 (within the discretization and the grid)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    mech = Mechanism("optin", 2.0, 0.0, 1)
    t = optin_delta(2.0, 1)[1]["noise_scale"]
    one = pld_lib.from_discrete_laplace_mechanism(1.0 / t, sensitivity=1, value_discretization_interval=DISCRETIZATION)
    theirs = one.compose(one).self_compose(12).get_epsilon_for_delta(1e-6)
    ours = compose([mech] * 12).get_epsilon_for_delta(1e-6)
    assert theirs - 1e-6 <= ours <= theirs + 0.05


def test_composition_is_never_looser_than_basic_and_grows_with_the_rounds() -> None:
    mech = Mechanism("optin", 1.0, 0.0, 1)
    eps = [totals([mech] * k, 1e-5).pld_epsilon for k in (1, 2, 4, 8, 12)]
    assert all(a < b for a, b in itertools.pairwise(eps))
    assert all(e <= k * 1.0 + 1e-9 for e, k in zip(eps, (1, 2, 4, 8, 12), strict=True))
    assert eps[-1] < 11.5  # at ε = 1 a round's loss is spread enough for accounting to gain: ~10.9 < 12
    assert totals([Mechanism("optin", 4.0, 0.0, 1)] * 12, 2e-5).pld_epsilon == pytest.approx(48.0, abs=0.05)
    # the head list's threshold δ composes additively, but the exact one: a round claimed at δ = 1e-5 puts only
    # 7.3e-7 on infinite loss, so 12 rounds hold at δ = 2e-5 (basic composition: 1.2e-4) and not at 5e-6
    hl = [Mechanism("headlist", 4.0, 1e-5, 1)] * 12
    p_inf = headlist_delta(4.0, 1e-5, 1, at_epsilon=100.0)[0].delta
    assert 12 * p_inf < 2e-5 < totals(hl, 2e-5).basic[1]
    assert totals(hl, 2e-5).pld_epsilon == pytest.approx(48.0, abs=0.05)
    assert math.isinf(totals(hl, 0.9 * 12 * p_inf).pld_epsilon)


def test_bad_mechanisms_are_refused() -> None:
    for kw, needle in (({"kind": "x"}, "kind"), ({"epsilon": 0.0}, "epsilon"), ({"delta": 1.0}, "delta")):
        with pytest.raises(ParameterError, match=needle):
            Mechanism(**{"kind": "optin", "epsilon": 1.0, "delta": 0.0, **kw})
    with pytest.raises(ParameterError, match="at least one round"):
        compose([])


def test_privacy_compose_command() -> None:
    r = CliRunner().invoke(cli, ["privacy", "compose", "--rounds", "4", "--epsilon", "1", "--delta", "1e-7",
                                 "--json"])
    assert r.exit_code == 0, r.output + r.stderr
    doc = json.loads(r.output)
    rows = {g["group"].split()[0]: g for g in doc["groups"]}
    assert rows["optin-T"]["basic_epsilon"] == 4.0 and rows["optin-T"]["pld_epsilon"] < 4.0
    assert rows["optin-S"]["pld_epsilon"] <= 4.0
    r = CliRunner().invoke(cli, ["privacy", "compose"])
    assert r.exit_code == 0 and "PLD ε" in r.output
    for bad, needle in ((["--m-o", "4"], "--m-o"), (["--target-delta", "0"], "--target-delta"),
                        (["--epsilon", "0.5"], "epsilon")):
        r = CliRunner().invoke(cli, ["privacy", "compose", *bad])
        assert r.exit_code != 0 and needle in r.output + r.stderr and "Traceback" not in r.output + r.stderr


def test_localalg_delta_from_the_laws_structure_equals_every_pair() -> None:
    """The structural maximum (over URL counts) equals the brute-force maximum over all pairs of records of the
    closed-form law, on 150 random head lists, ε below and above 0 (exact to rounding)."""
    rng = np.random.default_rng(11)
    for _ in range(150):
        k = int(rng.integers(1, 7))
        kq = (*(int(x) for x in rng.integers(1, 5, size=k)), 1)
        mech = Mechanism("local", float(rng.uniform(0.8, 6.0)), 1e-5, kq=kq, f_c=float(rng.uniform(0.5, 0.95)),
                         m_c=int(rng.integers(1, 3)))
        lp = localalg_law(mech)
        law = output_distribution(lp)
        for eps in (-3.0, -0.3, 0.0, 0.7, mech.epsilon / mech.m_c, mech.epsilon + 0.5):
            assert localalg_delta(lp, eps) == pytest.approx(privacy_loss_delta(law, eps), abs=1e-12), (kq, eps)


def test_a_device_with_m_c_reports_composes_them() -> None:
    one = Mechanism("local", 2.0, 1e-6, kq=(3, 2, 1), f_c=0.85, m_c=1)
    two = Mechanism("local", 4.0, 1e-6, kq=(3, 2, 1), f_c=0.85, m_c=2)  # ε/2 a report, two reports
    assert round_pld(two).get_epsilon_for_delta(1e-5) <= 4.0 + 1e-9
    assert round_pld(one).get_epsilon_for_delta(1e-5) <= 2.0 + 1e-9


def test_privacy_compose_with_a_device_head_list(tmp_path) -> None:
    from test_localalg import signed_headlist
    path = tmp_path / "hl.json"
    path.write_text(json.dumps(signed_headlist(epsilon=4, delta=1e-5, f_c=0.85, m_c=1)))
    r = CliRunner().invoke(cli, ["privacy", "compose", "--rounds", "12", "--head-list", str(path), "--json"])
    assert r.exit_code == 0, r.output + r.stderr
    device = json.loads(r.output)["groups"][2]
    assert device["group"].startswith("clients (LocalAlg on") and device["pld_epsilon"] < device["basic_epsilon"]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = CliRunner().invoke(cli, ["privacy", "compose", "--head-list", str(bad)])
    assert r.exit_code != 0 and "Traceback" not in r.output + r.stderr


def test_a_round_whose_e_to_the_epsilon_overflows_is_counted_not_a_crash() -> None:
    """A service round may have ε up to ~835 (LocalAlg's own limit); e^ε overflows a float beyond ~709.8. Creating a
    series of such rounds answered 500 ("math range error", found by schemathesis): the accountant composed it. Now
    such a round is counted by basic composition (no lifetime budget a service takes admits one), and the advanced
    composition of the ledger is infinite, not an error."""
    from hybriddp.privacy.ledger import advanced_composition
    from hybriddp.service.roundparams import validate_params

    for kind, params in (("blender", {"epsilon": 800.0, "delta": 1e-5, "head_list_size": 10}),
                         ("mean", {"epsilon": 800.0, "lower": 0.0, "upper": 1.0})):
        assert admitted_rounds(round_mechanism(kind, validate_params(kind, params)), 16.0, 1e-4, 12) == (0, 0)
    assert advanced_composition([800.0, 1.0], [0.0, 0.0], 1e-6)[0] == math.inf
