"""The lifetime privacy budget: the one rule every ledger applies before a release (PRIVACY.md, "Outputs appear
only with their charge"; ALGORITHM.md §2, §3.4).

A user's releases compose by **basic composition**: releases (ε_i, δ_i) together are (Σε_i, Σδ_i)-DP. A
charge is refused when it would take a user's sums of *private* charges past the lifetime budget (ε_L, δ_L),
unless a tighter accountant the ledger passes (the collection service's privacy-loss-distribution accounting,
ALGORITHM.md §14) finds the user's whole history within (ε_L, δ_L): the tighter of the two rules is enforced.
A non-private (seeded) charge gives no guarantee: it adds nothing to the sums and is never refused. The
comparison allows the relative :data:`TOLERANCE`, so charges whose real sum is exactly the budget are not
refused for the rounding of their float sum.

The rule states the facts (who would pass the budget, the worst totals); each ledger words its own refusal:
the file ledger (:mod:`hybriddp.privacy.ledger`), the collection service's store and the device ledger
(:mod:`hybriddp.device.ledger`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

TOLERANCE = 1e-12
"""Relative slack of the comparison with the lifetime budget: a total up to budget·(1 + TOLERANCE) is within it."""

K = TypeVar("K", bound=Hashable)
Spend = tuple[float, float]
"""(ε, δ): one charge, or a user's sums (Σε, Σδ) under basic composition."""


def compose(spent: Spend, charge: Spend) -> Spend:
    """Basic composition of one more release: (Σε + ε, Σδ + δ)."""
    return spent[0] + charge[0], spent[1] + charge[1]


@dataclass(frozen=True)
class Overrun(Generic[K]):
    """The users a charge would take past the lifetime budget and the worst of their totals.

    ``users``: in the order the charges were given; ``epsilon``, ``delta``: the largest (Σε, Σδ) among them
    (ordered by Σε, then Σδ), the charge included.
    """

    users: tuple[K, ...]
    epsilon: float
    delta: float


@dataclass(frozen=True)
class LifetimeBudget:
    """A lifetime budget (ε_L, δ_L) and the rule that enforces it (module docstring)."""

    epsilon: float
    delta: float

    def exceeded_by(self, epsilon: float, delta: float) -> bool:
        """True if the totals (Σε, Σδ) pass the budget beyond the relative :data:`TOLERANCE`."""
        return epsilon > self.epsilon * (1 + TOLERANCE) or delta > self.delta * (1 + TOLERANCE)

    def overrun(self, charges: Mapping[K, Spend], spent: Mapping[K, Spend],
                tighter: Callable[[Sequence[K]], set[K]] | None = None) -> Overrun[K] | None:
        """Who the private ``charges`` (user → (ε, δ)) would take past the budget, given what each user spent
        in private charges before (user → (Σε, Σδ); a user missing there spent nothing); None if nobody.

        ``tighter``: a second, tighter accountant (the service's privacy-loss-distribution accounting,
        :func:`hybriddp.audit.pld.history_epsilon`): given the users basic composition would refuse, it returns
        those whose whole history, this charge included, is still within the budget by its count; they pass.
        Pass private charges only: a non-private charge adds nothing to a user's sums, so it is not checked.
        """
        over: dict[K, Spend] = {}
        for user, charge in charges.items():
            total = compose(spent.get(user, (0.0, 0.0)), charge)
            if self.exceeded_by(*total):
                over[user] = total
        if over and tighter is not None:
            for user in tighter(list(over)):
                over.pop(user, None)
        if not over:
            return None
        worst = max(over.values())
        return Overrun(tuple(over), worst[0], worst[1])


__all__ = ["TOLERANCE", "LifetimeBudget", "Overrun", "Spend", "compose"]
