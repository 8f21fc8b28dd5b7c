"""The service's lifetime budget enforced with the tighter of basic composition and PLD accounting (issue 30,
ALGORITHM.md §14), on both databases.

An opt-in user charged in rounds of ε = 1 against a lifetime budget of ε = 11, δ = 1e-4: basic composition stops
them after 10 rounds (δ = 1e-5 a round: Σδ reaches 1e-4 first); privacy-loss-distribution accounting of the
exact per-round mechanisms admits more. How many is computed here by the accountant itself
(:func:`hybriddp.audit.pld.history_epsilon`; tests/test_pld.py checks it against the exact audit and against
dp-accounting), and the store must admit exactly those: at the build's charge and at enrolment. A round accounted
by its (ε, δ) alone (a mean round) gains nothing.
"""

from __future__ import annotations

import pytest

from hybriddp.audit.pld import Mechanism, history_epsilon
from hybriddp.privacy.ledger import BudgetExceededError, Charge
from hybriddp.service import roundparams
from hybriddp.service.ledger_view import service_ledger
from hybriddp.service.store import Store

LIFETIME = (11.0, 1e-4)
ROUND = {"epsilon": 1.0, "delta": 1e-5, "head_list_size": 10}


def admitted_by_pld(limit: int = 30) -> int:
    """Rounds of ε = 1 one user can take part in under the lifetime budget, by the PLD accountant."""
    k = 0
    while k < limit and history_epsilon([Mechanism("optin-any", 1.0, 1e-5)] * (k + 1), LIFETIME[1]) <= LIFETIME[0]:
        k += 1
    return k


@pytest.fixture
def store(store_url: str) -> Store:
    st = Store(store_url, lifetime_epsilon=LIFETIME[0], lifetime_delta=LIFETIME[1])
    yield st
    st.close()


def new_round(store: Store, kind: str = "blender", params: dict | None = None) -> object:
    return store.create_round(kind, None, roundparams.validate_params(kind, params or ROUND))


def test_pld_admits_more_rounds_than_basic_composition_and_no_more_than_it_says(store: Store) -> None:
    k_pld = admitted_by_pld()
    assert k_pld > 11  # basic: 10 (10 × δ 1e-5 = the lifetime δ); even ε alone would stop at 11
    pair = [store.pseudonym("alice"), store.pseudonym("bob")]  # the ledger charges pseudonyms
    for _ in range(k_pld):
        store.charge(new_round(store), [Charge("optin", pair, 1.0, 1e-5)])
    assert store.spent("alice") == pytest.approx((float(k_pld), k_pld * 1e-5))  # past the basic sums
    with pytest.raises(BudgetExceededError, match="2 opt-in user"):
        store.charge(new_round(store), [Charge("optin", pair, 1.0, 1e-5)])
    store.charge(new_round(store), [Charge("optin", [store.pseudonym("carol")], 1.0, 1e-5)])  # others are unaffected
    view = service_ledger(store.engine)  # `hybriddp privacy report`: basic sums and the enforced ε side by side
    alice = next(p for p in view["pseudonyms"] if p["pseudonym"] == pair[0])
    assert alice["epsilon"] == pytest.approx(k_pld) and alice["rounds"] == k_pld
    assert alice["pld_epsilon"] == pytest.approx(
        history_epsilon([Mechanism("optin-any", 1.0, 1e-5)] * k_pld, LIFETIME[1])) and alice["pld_epsilon"] <= 11.0
    assert view["worst_pld_epsilon"] == alice["pld_epsilon"] and view["worst_basic_epsilon"] == pytest.approx(k_pld)


def test_enrolment_follows_the_same_rule(store: Store) -> None:
    k_pld = admitted_by_pld()
    for _ in range(k_pld - 1):
        store.charge(new_round(store), [Charge("optin", [store.pseudonym("dave")], 1.0, 1e-5)])
    rnd = new_round(store)
    store.enrol(rnd.id, "dave")  # the k-th round still fits (by PLD, not by basic composition)
    store.charge(rnd, [Charge("optin", [store.pseudonym("dave")], 1.0, 1e-5)])
    with pytest.raises(BudgetExceededError, match="cannot enrol user 'dave'"):
        store.enrol(new_round(store).id, "dave")


def test_rounds_accounted_by_their_stated_epsilon_get_basic_composition(store: Store) -> None:
    mean = {"epsilon": 1.0, "lower": 0.0, "upper": 1.0}
    for _ in range(11):
        store.charge(new_round(store, "mean", mean), [Charge("optin", [store.pseudonym("erin")], 1.0, 0.0)])
    assert history_epsilon([Mechanism("stated", 1.0, 0.0)] * 12, LIFETIME[1]) > LIFETIME[0]
    with pytest.raises(BudgetExceededError):
        store.charge(new_round(store, "mean", mean), [Charge("optin", [store.pseudonym("erin")], 1.0, 0.0)])
