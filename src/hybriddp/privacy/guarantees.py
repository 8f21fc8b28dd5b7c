"""What each mechanism guarantees, stated once, numerically (ALGORITHM.md §1, §2, §5).

A :class:`Guarantee` is the (ε, δ) one group of users gets from one mechanism, in one trust
model. The privacy ledger's charges (:func:`charges`) and the guarantee printed or written
with a result (:func:`describe`) are both computed from these objects, so the two can never
disagree.

BLENDER's round releases three things (paper Theorems 1–3):

* CreateHeadList on S: (ε, δ)-DP for the users of S, trusted-curator model (Theorem 1);
* EstimateOptinProbabilities on T: (ε, 0)-DP for the users of T, trusted-curator model
  (Theorem 2; Laplace noise on counts with sensitivity 2m_O);
* LocalAlg on each client: (ε, δ)-local DP (Theorem 3), split f_C : 1 − f_C between the
  query and the URL, ε/m_C per report.

S, T and the clients are disjoint, so every user gets exactly one of these per round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from hybriddp.privacy.ledger import Charge

CURATOR = "trusted-curator"
LOCAL = "local"


@dataclass(frozen=True)
class Guarantee:
    """(ε, δ)-DP that ``group`` gets from ``mechanism`` in ``model`` (``CURATOR`` or ``LOCAL``).

    ``group`` is also the ledger's group name; ``reference`` names the theorem; ``detail`` adds
    what the numbers depend on (f_C, m_C, ...) for people, not for accounting.
    """

    group: str
    mechanism: str
    epsilon: float
    delta: float
    model: str
    reference: str
    detail: str = ""

    def text(self) -> str:
        """One line for people, e.g. ``(4.0, 1e-05)-DP, trusted-curator model (Theorem 1)``."""
        kind = "local DP" if self.model == LOCAL else f"DP, {self.model} model"
        extra = f", {self.detail}" if self.detail else ""
        return f"({self.epsilon:g}, {self.delta:g})-{kind} ({self.reference}){extra}"

    def to_json(self) -> dict[str, Any]:
        """The numbers and labels as a plain dict."""
        return asdict(self)


def headlist_guarantee(epsilon: float, delta: float) -> Guarantee:
    """CreateHeadList on S (ALGORITHM.md §3, Theorem 1)."""
    return Guarantee("optin-S", "CreateHeadList", float(epsilon), float(delta), CURATOR, "Theorem 1")


def optin_estimate_guarantee(epsilon: float) -> Guarantee:
    """EstimateOptinProbabilities on T (ALGORITHM.md §4, Theorem 2): pure ε-DP."""
    return Guarantee("optin-T", "EstimateOptinProbabilities", float(epsilon), 0.0, CURATOR, "Theorem 2")


def localalg_guarantee(epsilon: float, delta: float, f_c: float, m_c: int) -> Guarantee:
    """LocalAlg on every client (ALGORITHM.md §5, Theorem 3)."""
    return Guarantee("clients", "LocalAlg", float(epsilon), float(delta), LOCAL, "Theorem 3",
                     f"f_C = {f_c:g}, m_C = {m_c}")


def curator_guarantees(epsilon: float, delta: float) -> tuple[Guarantee, Guarantee]:
    """The curator's two releases of a round: S (Theorem 1) and T (Theorem 2)."""
    return headlist_guarantee(epsilon, delta), optin_estimate_guarantee(epsilon)


def blender_guarantees(epsilon: float, delta: float, f_c: float, m_c: int) -> tuple[Guarantee, ...]:
    """Every guarantee of one BLENDER round (ALGORITHM.md §2)."""
    return (*curator_guarantees(epsilon, delta), localalg_guarantee(epsilon, delta, f_c, m_c))


def charges(guarantees: Sequence[Guarantee], users: dict[str, np.ndarray | Sequence[str]], *,
            private: bool = True) -> list[Charge]:
    """Ledger charges: each guarantee's (ε, δ) for the users of its group (``users[group]``).

    Groups without users (for example the clients, whom the curator's ledger never sees) are
    left out. ``private=False`` marks the charges of a seeded release: its noise is reproducible
    by anyone who knows the seed, so the (ε, δ) it states is not a guarantee (the ledger records
    it and reports it as non-private).
    """
    from hybriddp.privacy.ledger import Charge

    return [Charge(g.group, users[g.group], g.epsilon, g.delta, private) for g in guarantees if g.group in users]


def describe(guarantees: Sequence[Guarantee]) -> dict[str, Any]:
    """The printed guarantee of a result: per group a line of text, plus the numbers.

    Keys: ``optin_users`` (S and T together, the weaker of the two, as the CLI has always
    printed it), ``clients``, ``all_users`` — whichever apply — and ``mechanisms``, the list of
    numeric guarantees the ledger charges.
    """
    out: dict[str, Any] = {}
    by_group = {g.group: g for g in guarantees}
    s, t = by_group.get("optin-S"), by_group.get("optin-T")
    if s and t:
        out["optin_users"] = (f"({max(s.epsilon, t.epsilon):g}, {max(s.delta, t.delta):g})-DP, "
                              f"{CURATOR} model (Theorems 1, 2)")
    for g in guarantees:
        if g.group in ("optin-S", "optin-T"):
            continue
        key = "clients" if g.group == "clients" else g.group.replace("-", "_")
        out[key] = g.text()
    out["mechanisms"] = [g.to_json() for g in guarantees]
    return out
