"""The figures of the paper's evaluation (§4.2, Figures 9 and 11–16) as data.

A :class:`Figure` names the parameter it sweeps, the values, the metrics on its y axis, the
algorithms drawn and the head-list sizes M. :meth:`Figure.points` turns it into the
parameter points it needs; a point is figure-independent (:class:`Point`), so figures that
share a point (e.g. the paper defaults appear in Figures 9, 11, 14 and 16) share its runs.

Grids (paper §4.2; ``quick`` shrinks every grid for tests):

Every figure draws BLENDER twice: with the paper's estimator (``blender``, what the paper plots) and with
the estimator hybriddp ships by default (:data:`DEFAULT_LINE`, ``blender-reuse`` while the default is
``reuse``), run with the same seeds (paired); :data:`ALGORITHM_ESTIMATORS` names each line's estimator.
Every L1 panel has its union form next to it (``l1_union``, ALGORITHM.md §9), which a junk list cannot win.

* Fig. 9 — the top-10 query table at the paper defaults (Fig. 10), and the default's regressions.
* Fig. 11 — f_C = 0.50, 0.55, …, 0.95; L1 and generalized NDCG of client-only, opt-in-only
  and blended (one BLENDER run per point gives all three), and the default estimator's blend.
* Fig. 12 — ε = 1, 1.5, …, 5; NDCG@10 over queries (and the union L1) of BLENDER, BLENDER with tune's
  knobs and the local-only baselines, head-list size 10 (as in the paper's comparison with Qin et al.).
* Figs. 13 / 14 — opt-in fraction 1%, 1.5%, 2%, 2.5%, 3%, …, 10% (4.5% included); L1 /
  generalized NDCG of BLENDER for several M (AOL 10, 25, 50, 100; Yandex 50, 100, 250, 500).
* Figs. 15 / 16 — ε = 1, 1.5, …, 5; L1 / generalized NDCG of BLENDER for the same M.
* ``estimators`` (beyond the paper) — ε = 1, 1.5, …, 5 at M = 10 (Fig. 12's) and the dataset's M;
  record and query L1, generalized NDCG and NDCG@10 of BLENDER with the paper's blend weights, with
  pooled ones (from the same runs), with ``--estimator reuse`` (ALGORITHM.md §4.1; runs with the same
  seeds) and with ``--estimator consistent`` (§7.1; the reuse runs reblended).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybriddp.core.estimators import DEFAULT_ESTIMATOR
from hybriddp.core.params import BlenderParams

FIGURE_NAMES = ("fig9", "fig11", "fig12", "fig13", "fig14", "fig15", "fig16", "sizes", "estimators")
"""Every figure ``hybriddp experiment`` makes (the paper's, and ``sizes`` beyond it); ``all`` means all of them."""

FAMILY_OF = {"blender": "blender", "optin-only": "blender", "client-only": "blender", "blender-pooled": "blender",
             "blender-reuse": "blender-reuse", "blender-consistent": "blender-reuse",
             "local-only": "local-only", "local-only-hashed": "local-only-hashed",
             "blender-tuned": "blender-tuned"}
"""The run that produces each algorithm: one BLENDER run gives ``blender``, ``optin-only`` and
``client-only``, and ``blender-pooled`` (its estimates with pooled blend weights) (paired,
:func:`hybriddp.simulation.algorithms.blender_family`); ``blender-reuse`` is BLENDER with ``--estimator reuse``
(a run of its own, with the point's seed: paired by seed), and ``blender-consistent`` that run with
consistent queries (ALGORITHM.md §7.1); ``blender-tuned`` is
BLENDER with the knobs tune picks from an earlier round (:mod:`hybriddp.experiments.tuned`)."""

PAPER_ESTIMATOR = "paper"
"""The estimator of the paper's figures (Fig. 4, Fig. 7): the ``blender`` line and its ingredients."""

TUNED_ESTIMATOR = DEFAULT_ESTIMATOR
"""The estimator ``blender-tuned`` runs, and the one ``hybriddp tune`` is asked to simulate when it picks the
knobs (:mod:`hybriddp.experiments.tuned`): a deployment tunes the estimator it ships."""

ALGORITHM_ESTIMATORS: dict[str, str | None] = {
    "blender": PAPER_ESTIMATOR, "optin-only": PAPER_ESTIMATOR, "client-only": PAPER_ESTIMATOR,
    "blender-pooled": "pooled", "blender-reuse": "reuse", "blender-consistent": "consistent",
    "blender-tuned": TUNED_ESTIMATOR, "local-only": None, "local-only-hashed": None}
"""The estimator (``--estimator``, :mod:`hybriddp.core.estimators`) of each line; None: not BLENDER (the
local-only baselines estimate with LocalAlg's client side alone). ``optin-only`` and ``client-only`` are the
ingredients of the paper's run."""

LINE_OF_ESTIMATOR = {ALGORITHM_ESTIMATORS[line]: line
                     for line in ("blender", "blender-pooled", "blender-reuse", "blender-consistent")}
"""The line that runs each estimator at the paper's knobs (the inverse of :data:`ALGORITHM_ESTIMATORS` there)."""

DEFAULT_LINE = LINE_OF_ESTIMATOR[DEFAULT_ESTIMATOR]
"""The line of the default estimator: what ``hybriddp run`` and the service ship, drawn next to the paper's."""

FAMILY_ALGORITHMS = {"blender": ("blender", "optin-only", "client-only", "blender-pooled"),
                     "blender-reuse": ("blender-reuse", "blender-consistent"),
                     "local-only": ("local-only",), "local-only-hashed": ("local-only-hashed",),
                     "blender-tuned": ("blender-tuned",)}

HEAD_LIST_SIZES = {"aol": (10, 25, 50, 100), "yandex": (50, 100, 250, 500)}
"""M of Figures 13–16 per dataset (paper Figs. 13a/b–16a/b); a log file uses the AOL sizes."""

EPSILONS = tuple(1.0 + 0.5 * i for i in range(9))  # 1, 1.5, ..., 5
F_CS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # 0.50, ..., 0.95
OPTIN_FRACTIONS = (0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.045, 0.05, 0.06, 0.07, 0.08, 0.09, 0.10)
FIG12_HEAD_LIST_SIZE = 10  # "head list size=10" (paper Fig. 12 caption)

METRIC_LABELS = {
    "l1": "L1 over head-list records (lower is better)",
    "l1_union": "L1 over the list ∪ the true top-M records (lower is better)",
    "l1_queries": "L1 over head-list queries (lower is better)",
    "ndcg": "generalized NDCG (higher is better)",
    "ndcg_queries_at_10": "NDCG@10 over queries (higher is better)",
}
X_LABELS = {
    "f_c": "f_C: share of the client budget spent on the query",
    "epsilon": "privacy loss ε per user",
    "optin_fraction": "opt-in users (% of all users)",
    "head_list_size": "head-list size M (records)",
}


@dataclass(frozen=True, order=True)
class Point:
    """One parameter setting (everything the figures sweep); other knobs keep their defaults."""

    epsilon: float
    delta: float
    optin_fraction: float
    f_c: float
    head_list_size: int

    @classmethod
    def of(cls, p: BlenderParams) -> Point:
        return cls(float(p.epsilon), float(p.delta), float(p.optin_fraction), float(p.f_c), int(p.head_list_size))

    def params(self) -> BlenderParams:
        """The validated :class:`BlenderParams` of this point (f_O, m_O, m_C: paper defaults; the paper's
        estimator, which the paper's figures reproduce: the other lines ask for their own)."""
        return BlenderParams(epsilon=self.epsilon, delta=self.delta, optin_fraction=self.optin_fraction,
                             f_c=self.f_c, head_list_size=self.head_list_size, estimator=PAPER_ESTIMATOR)

    def key(self) -> str:
        """Canonical text (also what the trial seed is hashed from)."""
        return (f"eps={self.epsilon:.10g},delta={self.delta:.10g},optin={self.optin_fraction:.10g},"
                f"fc={self.f_c:.10g},M={self.head_list_size}")


@dataclass(frozen=True)
class Figure:
    """One figure of the paper: a sweep of ``x_name`` drawn for ``algorithms`` × ``head_list_sizes``.

    Attributes
    ----------
    name : ``fig11`` …
    title : what the paper's caption says.
    x_name : the swept :class:`Point` field, or ``None`` for the Fig. 9 table.
    x_values : the grid.
    metrics : the metrics drawn (keys of :attr:`hybriddp.server.result.Result.metrics`), one panel each.
    algorithms : the algorithms drawn.
    head_list_sizes : the sizes M drawn (one line each); empty means the dataset default.
    """

    name: str
    title: str
    x_name: str | None
    x_values: tuple[float, ...]
    metrics: tuple[str, ...]
    algorithms: tuple[str, ...]
    head_list_sizes: tuple[int, ...] = ()

    def sizes(self, base: Point) -> tuple[int, ...]:
        return self.head_list_sizes or (base.head_list_size,)

    @property
    def sweeps_m(self) -> bool:
        """The x axis is the head-list size itself (one line per algorithm, not per M)."""
        return self.x_name == "head_list_size"

    def points(self, base: Point) -> list[tuple[float | None, int, Point]]:
        """``(x, M, point)`` for every plotted position (Fig. 9: the single base point)."""
        if self.sweeps_m:
            return [(x, int(x), replace(base, head_list_size=int(x))) for x in self.x_values]
        out: list[tuple[float | None, int, Point]] = []
        for m in self.sizes(base):
            at_m = replace(base, head_list_size=m)
            if self.x_name is None:
                out.append((None, m, at_m))
                continue
            for x in self.x_values:
                out.append((x, m, replace(at_m, **{self.x_name: x})))
        return out

    def families(self) -> tuple[str, ...]:
        """The runs needed (``blender`` and/or ``local-only``)."""
        return tuple(dict.fromkeys(FAMILY_OF[a] for a in self.algorithms))


def figures(dataset_kind: str, *, quick: bool = False) -> dict[str, Figure]:
    """The figure definitions for a dataset (``aol``, ``yandex``, or ``file`` = AOL sizes).

    ``quick`` keeps two values per grid and the smallest and largest M: for tests only.
    """
    sizes = HEAD_LIST_SIZES.get(dataset_kind, HEAD_LIST_SIZES["aol"])
    eps, fcs, opt = EPSILONS, F_CS, OPTIN_FRACTIONS
    fig12_m = FIG12_HEAD_LIST_SIZE
    preset = dataset_kind if dataset_kind in HEAD_LIST_SIZES else "aol"  # a file: AOL's defaults
    est_sizes = (fig12_m, BlenderParams.paper_defaults(preset).head_list_size)
    if quick:
        est_sizes = (fig12_m,)
        eps, fcs, opt, sizes = (2.0, 4.0), (0.5, 0.85), (0.05, 0.1), (sizes[0], sizes[-1])
    m_label = "head-list sizes M"
    both = tuple(dict.fromkeys(("blender", DEFAULT_LINE)))  # the paper's estimator and the default
    figs = [
        Figure("fig9", "Top-10 queries: true p_q and the estimates of BLENDER's ingredients (paper Fig. 9)",
               None, (), (), both),
        Figure("fig11", "Budget split f_C: client, opt-in and blended results (paper Fig. 11)",
               "f_c", fcs, ("l1", "l1_union", "ndcg"), ("client-only", "optin-only", *both)),
        Figure("fig12", f"NDCG@10 of queries vs ε, head list size {fig12_m}: BLENDER vs local-only "
               "(paper Fig. 12)", "epsilon", eps, ("ndcg_queries_at_10", "l1_union"),
               (*both, "blender-tuned", "local-only", "local-only-hashed"), (fig12_m,)),
        Figure("fig13", f"L1 vs opt-in percentage for select {m_label} (paper Fig. 13)",
               "optin_fraction", opt, ("l1", "l1_union"), both, sizes),
        Figure("fig14", f"Generalized NDCG vs opt-in percentage for select {m_label} (paper Fig. 14)",
               "optin_fraction", opt, ("ndcg",), both, sizes),
        Figure("fig15", f"L1 vs ε for select {m_label} (paper Fig. 15)", "epsilon", eps, ("l1", "l1_union"), both,
               sizes),
        Figure("fig16", f"Generalized NDCG vs ε for select {m_label} (paper Fig. 16)",
               "epsilon", eps, ("ndcg",), both, sizes),
        Figure("sizes", "Beyond the paper: generalized NDCG and L1 vs head-list size M, BLENDER vs local-only",
               "head_list_size", tuple(float(m) for m in sizes), ("ndcg", "l1", "l1_union"),
               (*both, "local-only", "local-only-hashed")),
        Figure("estimators", "Beyond the paper: the paper's estimates against pooled blend weights (ALGORITHM.md "
               "§7), reused S counts (§4.1) and consistent queries (§7.1), paired by seed; M = 10 as in Fig. 12, and "
               "the dataset's M", "epsilon", eps, ("l1", "l1_union", "l1_queries", "ndcg", "ndcg_queries_at_10"),
               ("blender", "blender-pooled", "blender-reuse", "blender-consistent"), est_sizes),
    ]
    return {f.name: f for f in figs}


def select(name: str) -> tuple[str, ...]:
    """Figure names of an experiment NAME (``all`` or one figure); raises ParameterError otherwise."""
    from hybriddp.core.errors import parameter_error

    if name == "all":
        return FIGURE_NAMES
    if name not in FIGURE_NAMES:
        raise parameter_error("experiment NAME", name, "one of " + ", ".join((*FIGURE_NAMES, "all")))
    return (name,)
