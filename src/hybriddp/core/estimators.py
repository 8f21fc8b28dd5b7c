"""The estimators: each user-facing name (``--estimator``, a service round's ``estimator``) is two decisions of
two parties, stated once here and rendered by the CLI, the service schema and the result summaries.

* :class:`Release`, the curator's: whether it releases the kept records' noisy counts from S with the head list
  and makes the opt-in estimates from S ∪ T (ALGORITHM.md §3.3, §4.1), or from T alone (Fig. 4, §4).
* :class:`Blend`, the server's: how it weighs the opt-in estimates against the clients' (§7, §7.1). The strategy
  of each lives in ``hybriddp.server`` (``blend`` and ``consistency``), which maps a :class:`Blend` to it.

Two estimators with the same :class:`Release` make the same opt-in estimates, so the server can blend a release
with either (:meth:`Estimator.alternatives`); the :class:`Release` itself is the curator's, fixed by its release.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, auto
from types import MappingProxyType

from hybriddp.core.errors import parameter_error


class Release(Enum):
    """What the curator releases with the head list (ALGORITHM.md §3.3, §4.1)."""

    PAPER = auto()
    """The head list and the opt-in estimates from T alone (Fig. 4, §4); S's noisy counts are computed and dropped."""
    REUSE_S = auto()
    """Also the kept records' noisy counts from S, at no privacy cost (§3.3): S and T together choose the M records
    and enter their opt-in estimates (§4.1)."""


class Blend(Enum):
    """How the server weighs the opt-in estimates against the clients' (ALGORITHM.md §7, §7.1)."""

    PAPER = auto()
    """Fig. 7: each group's variance at its own estimate (biased low when a group's estimate is noisy)."""
    POOLED = auto()
    """Both variances at the blended estimate, iterated to a fixed point, less the bias that remains, reporting the
    blend's mean squared error (§7, "Pooled weights", "Bias correction", "Reported variance")."""
    CONSISTENT = auto()
    """:attr:`POOLED`, then every query's subtree corrected by generalized least squares so that a query is the sum
    of its entries (§7.1)."""


@dataclass(frozen=True)
class Estimator:
    """One user-facing estimator: its name, the two decisions and its one explanation.

    ``summary`` is the line printed with every result; ``help`` is the explanation the ``--estimator`` option and
    the service schema give.
    """

    name: str
    release: Release
    blend: Blend
    summary: str
    help: str

    @property
    def reuses_s(self) -> bool:
        """Whether the opt-in estimates are made from S ∪ T (ALGORITHM.md §4.1)."""
        return self.release is Release.REUSE_S

    def alternatives(self) -> tuple[str, ...]:
        """The names of the estimators a release made with this one can be blended with (the same release)."""
        return tuple(name for name, e in REGISTRY.items() if e.release is self.release)


REGISTRY: Mapping[str, Estimator] = MappingProxyType({e.name: e for e in (
    Estimator("paper", Release.PAPER, Blend.PAPER, "BLENDER as published (Fig. 4, Fig. 7)",
              "BLENDER as published: opt-in estimates from T; Fig. 7 weights, each group's variance at its own "
              "estimate: biased low when a group's estimate is noisy"),
    Estimator("pooled", Release.PAPER, Blend.POOLED, "the paper's estimates, pooled weights (§7)",
              "the paper's opt-in estimates; both variances at the blended estimate, iterated to a fixed point, less "
              "the bias that remains, with a variance that matches the error; docs/ALGORITHM.md §7"),
    Estimator("reuse", Release.REUSE_S, Blend.POOLED, "S's noisy counts, corrected for τ, join T's "
              "(docs/ALGORITHM.md §4.1)",
              "the curator also releases the kept records' noisy counts from S, at no privacy cost; S and T together "
              "then choose the M records and estimate them, S's counts corrected for having passed τ (unbiased near "
              "it), docs/ALGORITHM.md §3.3, §4.1; pooled weights"),
    Estimator("consistent", Release.REUSE_S, Blend.CONSISTENT, "reuse, then queries = sums of their entries (§7.1)",
              "'reuse', then each query's estimate and its entries' made to agree, query = sum of its entries, by "
              "generalized least squares: lower record error; docs/ALGORITHM.md §7.1"),
)})
"""Every estimator by name, in the order the CLI and the service schema list them."""

ESTIMATORS: tuple[str, ...] = tuple(REGISTRY)
"""The estimator names (``paper``, ``pooled``, ``reuse``, ``consistent``)."""

DEFAULT_ESTIMATOR = "reuse"
"""The default: never significantly worse than the paper's in the paired experiments on the presets and the real
samples, much better in L1 and NDCG (docs/results/README.md), and calibrated: S's counts are corrected for having
passed τ (ALGORITHM.md §4.1), so records listed in as few as 10% of the rounds have |bias| ≤ 0.08 of the RMSE in the
selection-bias harness, the reported variance 0.88–1.15 of the error there (docs/RESULTS.md). ``consistent`` lowers the
record error further but its residual bias reaches z 4 on one small query (docs/DECISIONS.md). ``paper`` is
one option away."""

LEGACY_ESTIMATOR = "paper"
"""What a release file or a service round stored before the ``estimator`` field existed used."""


def estimator_named(name: object, label: str = "estimator") -> Estimator:
    """The registered estimator called ``name``; a :class:`~hybriddp.core.errors.ParameterError` naming ``label``
    and the choices otherwise."""
    if isinstance(name, str) and name in REGISTRY:
        return REGISTRY[name]
    raise parameter_error(label, name, " or ".join(ESTIMATORS))


def describe_estimators() -> str:
    """Every estimator with its explanation, in registry order: ``'paper' (…), … or 'consistent' (…)``."""
    parts = [f"'{e.name}' ({e.help})" for e in REGISTRY.values()]
    return ", ".join(parts[:-1]) + " or " + parts[-1]

