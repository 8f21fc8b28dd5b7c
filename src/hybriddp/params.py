"""Parameters of a BLENDER run, validated once at construction (ALGORITHM.md §2, §3, §5).

Every check raises :class:`~hybriddp.errors.ParameterError` naming the parameter, its
value and the allowed range, so the CLI and the library give the same message.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from hybriddp.errors import parameter_error

LN2 = math.log(2.0)


def check_epsilon_for_head_list(epsilon: float) -> None:
    """Theorem 1 needs ε > ln 2 for CreateHeadList (ALGORITHM.md §3)."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > LN2):
        raise parameter_error(
            _label("epsilon"), epsilon, f"a finite number > ln 2 = {LN2:.4f} (Theorem 1 of the paper)",
            "Use a larger --epsilon (the paper's default is 4).",
        )


def check_delta(delta: float) -> None:
    """δ must lie strictly between 0 and 1."""
    if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
        raise parameter_error(
            _label("delta"), delta, "strictly between 0 and 1",
            "Typical values are below 1/number-of-users, e.g. 1e-5 or 1e-7.",
        )


OPTION_NAMES = {
    "epsilon": "--epsilon", "delta": "--delta", "optin_fraction": "--optin-fraction", "f_o": "--f-o",
    "f_c": "--f-c", "head_list_size": "--head-list-size", "m_o": "--m-o", "m_c": "--m-c",
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

    def __post_init__(self) -> None:
        check_head_list_params(self.epsilon, self.delta, self.m_o)
        check_fraction("optin_fraction", self.optin_fraction)
        check_fraction("f_o", self.f_o)
        check_fraction("f_c", self.f_c)
        check_positive_int("head_list_size", self.head_list_size)
        check_positive_int("m_c", self.m_c)

    @property
    def tau(self) -> float:
        """The head-list threshold τ of ALGORITHM.md §3."""
        return head_list_threshold(self.epsilon, self.delta, self.m_o)

    @property
    def b_optin(self) -> float:
        """b_S = b_T = 2·m_O/ε."""
        return head_list_scale(self.epsilon, self.m_o)

    def to_dict(self) -> dict[str, float | int | bool]:
        """Plain dict for JSON output."""
        return asdict(self)

    @classmethod
    def paper_defaults(cls, preset: str = "aol") -> BlenderParams:
        """Paper Fig. 10 defaults: AOL (δ=1e-5, 5%, M=50) or Yandex (δ=1e-7, 2.5%, M=500)."""
        if preset == "yandex":
            return cls(delta=1e-7, optin_fraction=0.025, head_list_size=500)
        return cls()
