"""Parameters of a BLENDER run, validated once at construction (ALGORITHM.md §2, §3, §5).

Every check raises :class:`~hybriddp.core.errors.ParameterError` naming the parameter, its
value and the allowed range, so the CLI and the library give the same message.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass

from hybriddp.core.errors import parameter_error
from hybriddp.core.estimators import DEFAULT_ESTIMATOR, Estimator, estimator_named
from hybriddp.core.estimators import ESTIMATORS as ESTIMATORS
from hybriddp.core.estimators import LEGACY_ESTIMATOR as LEGACY_ESTIMATOR
from hybriddp.core.protocol import max_epsilon

LN2 = math.log(2.0)

LN_MAX = math.log(sys.float_info.max)
"""≈ 709.78: the largest x whose e^x is a finite double. Every e^(a parameter) on the paths is checked
against it up front, so a huge ε is refused with the largest value that works instead of overflowing."""

MAX_EPSILON_HEAD_LIST = 2.0 * LN_MAX
"""≈ 1419.57: τ of CreateHeadList uses e^{ε/2} (ALGORITHM.md §3, Fig. 3 line 2)."""

MIN_DELTA = 1e-300
"""Smallest δ accepted: the discrete-noise threshold uses ln(2/δ), and 2/δ overflows below ~1.1e-308."""

MAX_RECORDS_PER_USER = 100
"""Largest m_O and m_C: sampling costs O(m²) per user and memory m per user (ALGORITHM.md §1); at
m = 100 the AOL-sized log (519,371 users) takes ~10 s and ~0.5 GB, the Yandex-sized one ten times that."""

PRECISION_DIGITS = 3
"""Significant digits LocalAlg's estimator denominator must keep (see :func:`min_report_epsilon`)."""

MAX_SEED = 2**63 - 1
"""Largest seed accepted (seeds are non-negative: NumPy's SeedSequence refuses negative ones)."""


def check_epsilon_for_head_list(epsilon: float) -> None:
    """Theorem 1 needs ε > ln 2 for CreateHeadList (ALGORITHM.md §3); τ needs e^{ε/2} finite."""
    if not (isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool) and math.isfinite(epsilon)
            and LN2 < epsilon <= MAX_EPSILON_HEAD_LIST):
        raise parameter_error(
            _label("epsilon"), epsilon, f"a finite number > ln 2 = {LN2:.4f} (Theorem 1 of the paper) and <= "
            f"{MAX_EPSILON_HEAD_LIST:.2f} (the threshold tau uses e^(epsilon/2), which overflows beyond)",
            "The paper's default is 4.",
        )


def check_delta(delta: float) -> None:
    """δ must lie in [1e-300, 1): strictly positive, and 2/δ finite (discrete-noise threshold)."""
    if not (isinstance(delta, (int, float)) and not isinstance(delta, bool) and MIN_DELTA <= delta < 1.0):
        raise parameter_error(
            _label("delta"), delta, f"strictly between 0 and 1, and at least {MIN_DELTA:g} (smaller values "
            "overflow the double-precision arithmetic of the head-list threshold)",
            "Typical values are below 1/number-of-users, e.g. 1e-5 or 1e-7.",
        )


def check_seed(seed: int | None, name: str = "seed (--seed)") -> None:
    """A seed is None (OS randomness) or an integer in [0, 2^63 − 1]."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise parameter_error(name, seed, f"an integer between 0 and 2^63 - 1 = {MAX_SEED}",
                              "Seeds are for reproducible experiments; leave --seed out for OS randomness.")


OPTION_NAMES = {
    "epsilon": "--epsilon", "delta": "--delta", "optin_fraction": "--optin-fraction", "f_o": "--f-o",
    "f_c": "--f-c", "head_list_size": "--head-list-size", "m_o": "--m-o", "m_c": "--m-c", "estimator": "--estimator",
}


def _label(name: str) -> str:
    """``f_o (--f-o)``: the library name and the command-line option."""
    return f"{name} ({OPTION_NAMES[name]})" if name in OPTION_NAMES else name


def check_fraction(name: str, value: float) -> None:
    """A fraction parameter must be in the open interval (0, 1)."""
    if not (isinstance(value, (int, float)) and 0.0 < value < 1.0):
        raise parameter_error(_label(name), value, "strictly between 0 and 1")


def check_positive_int(name: str, value: int) -> None:
    """Counts such as M, m_O, m_C must be integers ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise parameter_error(_label(name), value, "an integer >= 1")


def check_records_per_user(name: str, value: int) -> None:
    """m_O and m_C: integers in [1, :data:`MAX_RECORDS_PER_USER`] (sampling costs O(m²) per user)."""
    check_positive_int(name, value)
    if value > MAX_RECORDS_PER_USER:
        raise parameter_error(_label(name), value, f"at most {MAX_RECORDS_PER_USER} (sampling m records per user costs "
                              "O(m^2) time and m slots of memory per user)",
                              "The paper uses 1; each record then gets the whole budget.")


def min_report_epsilon() -> float:
    """The smallest per-report budget ε' LocalAlg can use: 10³·2⁻⁵⁰ ≈ 8.9e-13 (ALGORITHM.md §5, §6).

    The client estimator divides by a = (k·t − 1)/(k − 1) (and by D_q, the same form in t_q, k_q),
    where t = (e^ε' + (δ'/2)(k − 1))/(e^ε' + k − 1). For a small ε', k·t − 1 lies between ε'/2 and ε'
    while e^ε', t and k·t each carry a rounding error of at most 2⁻⁵³ in absolute terms (t ≈ 1/k), so
    the relative error of a is at most ≈ 2⁻⁵⁰/ε' whatever k is. Keeping :data:`PRECISION_DIGITS`
    significant digits needs ε' ≥ 10³·2⁻⁵⁰. (Below 2⁻⁵³, e^ε' rounds to exactly 1 and a is pure error.)
    """
    return 10.0 ** PRECISION_DIGITS * 2.0 ** -50


def max_client_epsilon(f_c: float, m_c: int, url_level: bool = True) -> float:
    """The largest ε whose LocalAlg budgets ε'_Q = f_C·ε/m_C and ε'_U = (1 − f_C)·ε/m_C keep e^ε' finite.

    A log without a URL level spends the whole budget on the query (f_C = 1).
    """
    return max_epsilon(f_c if url_level else 1.0, m_c)


def max_blender_epsilon(f_c: float, m_c: int, url_level: bool = True) -> float:
    """The largest ε BLENDER can run with: e^{ε/2} (τ) and LocalAlg's e^{ε'} must both be finite."""
    return min(MAX_EPSILON_HEAD_LIST, max_client_epsilon(f_c, m_c, url_level))


def check_client_epsilon(epsilon: float, f_c: float, m_c: int, url_level: bool = True,
                         limit: float | None = None) -> None:
    """ε must not overflow LocalAlg's e^{ε'} (ALGORITHM.md §5); the message gives the largest ε that works.

    ``limit`` (default :func:`max_client_epsilon`) may be lowered by the caller (e.g. to
    :func:`max_blender_epsilon`, which also covers τ).
    """
    limit = max_client_epsilon(f_c, m_c, url_level) if limit is None else limit
    if epsilon > limit:
        why = (f"f_c = {f_c:g}" if url_level else "the whole budget on the query (no URL level)") + f", m_c = {m_c}"
        raise parameter_error(
            _label("epsilon"), epsilon, f"<= {limit:.2f} with {why}: LocalAlg's keep probabilities use "
            "e^(f_C*epsilon/m_C) and e^((1-f_C)*epsilon/m_C), and the head-list threshold e^(epsilon/2); "
            "beyond, they overflow",
            "Values above ~20 already keep every report unchanged with probability ~1.")


def check_local_budget(epsilon: float, f_c: float, m_c: int, url_level: bool = True) -> None:
    """LocalAlg's arithmetic stays finite and meaningful (ALGORITHM.md §5, Fig. 6 lines 1-5).

    Refuses an ε whose e^{ε'} overflows (with the largest ε that works) and an f_C so close to 0 or
    1 that a per-report budget falls below :func:`min_report_epsilon` (with the range of f_C that
    works). ``url_level`` False: the whole budget goes to the query (f_C = 1; no URL stage).
    """
    check_client_epsilon(epsilon, f_c, m_c, url_level)
    if not url_level:
        return
    need = min_report_epsilon()
    lo = need * m_c / epsilon
    if min(f_c, 1.0 - f_c) < lo:
        raise parameter_error(
            _label("f_c"), f_c, f"between {lo:.3g} and 1 - {lo:.3g} at epsilon = {epsilon:g} and m_c = {m_c}: "
            f"below, the query or URL budget f_C*epsilon/m_C or (1-f_C)*epsilon/m_C is under {need:.3g}, and "
            "LocalAlg's keep probability cannot be told from 1/k in double precision (the client estimates would "
            "divide by rounding error)",
            "Use --f-c between 0.5 and 0.95 (the paper's 0.85).")


def head_list_scale(epsilon: float, m_o: int) -> float:
    """b_S = b_T = 2·m_O/ε, the Laplace scale of the curator's counts (ALGORITHM.md §3, §4)."""
    return 2.0 * m_o / epsilon


def head_list_threshold(epsilon: float, delta: float, m_o: int) -> float:
    """τ = b_S·(ln(e^{ε/2} + m_O − 1) − ln δ)  (ALGORITHM.md §3, Fig. 3 line 2)."""
    return head_list_scale(epsilon, m_o) * (math.log(math.exp(epsilon / 2.0) + m_o - 1) - math.log(delta))


def check_head_list_params(epsilon: float, delta: float, m_o: int) -> float:
    """Validate (ε, δ, m_O) for CreateHeadList and return τ; requires τ ≥ 1 (ALGORITHM.md §3)."""
    check_epsilon_for_head_list(epsilon)
    check_delta(delta)
    check_positive_int("m_o", m_o)
    tau = head_list_threshold(epsilon, delta, m_o)
    if tau < 1.0:
        raise parameter_error(
            "tau (head-list threshold)", round(tau, 6),
            ">= 1 (Theorem 1); it is computed from epsilon, delta and m_o",
            "Use a smaller --delta or a smaller --epsilon.",
        )
    return tau


@dataclass(frozen=True)
class BlenderParams:
    """The knobs of BLENDER(ε, δ, O, C, m_O, m_C, f_O, f_C, M)  (paper Fig. 2, ALGORITHM.md §2).

    Parameters
    ----------
    epsilon, delta:
        The (ε, δ) every user gets, opt-in (trusted-curator model) and client (local model).
    optin_fraction:
        Share of users in the opt-in group (simulation only: in a deployment the group is
        whoever opted in).
    f_o:
        Share of opt-in users in S (head-list creation); the rest, T, estimate probabilities.
    f_c:
        Share of a client's budget spent on the query (the rest on the URL).
    head_list_size:
        M, the number of (query, URL) records kept in the final head list.
    m_o, m_c:
        Records sampled per opt-in user / per client (without replacement).
    project:
        Project the blended record vector onto the probability simplex (ALGORITHM.md §7).
    estimator:
        The name of an estimator of :data:`hybriddp.core.estimators.REGISTRY` (default
        :data:`~hybriddp.core.estimators.DEFAULT_ESTIMATOR`); :attr:`estimator_spec` is what it means.
    """

    epsilon: float = 4.0
    delta: float = 1e-5
    optin_fraction: float = 0.05
    f_o: float = 0.95
    f_c: float = 0.85
    head_list_size: int = 50
    m_o: int = 1
    m_c: int = 1
    project: bool = True
    estimator: str = DEFAULT_ESTIMATOR

    def __post_init__(self) -> None:
        estimator_named(self.estimator, _label("estimator"))
        check_records_per_user("m_o", self.m_o)
        check_records_per_user("m_c", self.m_c)
        check_fraction("f_c", self.f_c)
        if isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon):  # the largest ε of the whole run
            check_client_epsilon(self.epsilon, self.f_c, self.m_c, limit=max_blender_epsilon(self.f_c, self.m_c))
        check_head_list_params(self.epsilon, self.delta, self.m_o)
        check_fraction("optin_fraction", self.optin_fraction)
        check_fraction("f_o", self.f_o)
        check_positive_int("head_list_size", self.head_list_size)
        check_local_budget(self.epsilon, self.f_c, self.m_c)

    @property
    def estimator_spec(self) -> Estimator:
        """The estimator :attr:`estimator` names: what the curator releases and how the server blends."""
        return estimator_named(self.estimator)

    @property
    def tau(self) -> float:
        """The head-list threshold τ of ALGORITHM.md §3."""
        return head_list_threshold(self.epsilon, self.delta, self.m_o)

    @property
    def b_optin(self) -> float:
        """b_S = b_T = 2·m_O/ε."""
        return head_list_scale(self.epsilon, self.m_o)

    def to_dict(self) -> dict[str, float | int | bool | str]:
        """Plain dict for JSON output."""
        return asdict(self)

    @classmethod
    def paper_defaults(cls, preset: str = "aol") -> BlenderParams:
        """Paper Fig. 10 defaults: AOL (δ=1e-5, 5%, M=50) or Yandex (δ=1e-7, 2.5%, M=500)."""
        if preset == "yandex":
            return cls(delta=1e-7, optin_fraction=0.025, head_list_size=500)
        return cls()
