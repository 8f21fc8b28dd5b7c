"""Value distributions on [0, 1] for the simulations, with exact per-group sums."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.mean.inputs import _label

_DYADIC = 2.0 ** -np.arange(1, 54)  # bit weights of a 53-bit uniform (NumPy's random())


@dataclass(frozen=True)
class Distribution:
    """A value distribution on [0, 1] (scaled to [lo, hi] by the caller).

    ``uniform``, ``beta:a,b`` (a, b > 0) or ``bernoulli:p`` (values lo and hi, 0 ≤ p ≤ 1).
    """

    kind: str
    params: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str | Distribution) -> Distribution:
        """Parse ``uniform`` / ``beta:a,b`` / ``bernoulli:p``."""
        if isinstance(text, Distribution):
            return text
        allowed = "uniform, beta:A,B with A, B > 0, or bernoulli:P with 0 <= P <= 1"
        kind, _, rest = str(text).strip().lower().partition(":")
        try:
            params = tuple(float(v) for v in rest.split(",")) if rest else ()
        except ValueError:
            raise parameter_error(_label("distribution"), text, allowed) from None
        ok = ((kind == "uniform" and not params)
              or (kind == "beta" and len(params) == 2 and all(math.isfinite(p) and p > 0 for p in params))
              or (kind == "bernoulli" and len(params) == 1 and 0.0 <= params[0] <= 1.0))
        if not ok:
            raise parameter_error(_label("distribution"), text, allowed)
        return cls(kind, params)

    def __str__(self) -> str:
        return self.kind + (":" + ",".join(f"{p:g}" for p in self.params) if self.params else "")

    @property
    def mean(self) -> float:
        """Mean on [0, 1]."""
        if self.kind == "uniform":
            return 0.5
        if self.kind == "beta":
            a, b = self.params
            return a / (a + b)
        return self.params[0]

    @property
    def variance(self) -> float:
        """Variance on [0, 1] (multiply by Δ² for [lo, hi])."""
        if self.kind == "uniform":
            return 1.0 / 12.0
        if self.kind == "beta":
            a, b = self.params
            return a * b / ((a + b) ** 2 * (a + b + 1.0))
        p = self.params[0]
        return p * (1.0 - p)

    def draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Values on [0, 1]."""
        if self.kind == "uniform":
            return rng.random(size)
        if self.kind == "beta":
            return rng.beta(self.params[0], self.params[1], size)
        return (rng.random(size) < self.params[0]).astype(np.float64)

    def elements_per_trial(self, m: int, squares: bool) -> int:
        """How many values :meth:`group_sums` materializes per trial for a group of m users."""
        if self.kind == "bernoulli":
            return 1
        if self.kind == "uniform" and not squares:
            return len(_DYADIC)
        return m

    def group_sums(self, rng: np.random.Generator, m: int, trials: int,
                   squares: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(Σ y, Σ y² or None) over m i.i.d. values, for each of ``trials`` trials.

        Exact in distribution, without an m × trials array where possible:

        * bernoulli: Σ y = Σ y² ~ Binomial(m, p);
        * uniform, sums only: NumPy's uniform is k·2⁻⁵³ with k uniform on 53 bits, whose bits are
          i.i.d. fair coins, so Σ_i U_i = Σ_j 2⁻ʲ N_j with N_j ~ Binomial(m, 1/2) independent;
        * otherwise the values are drawn, in blocks of at most ``_BLOCK_ELEMENTS``.
        """
        if self.kind == "bernoulli":
            s = rng.binomial(m, self.params[0], trials).astype(np.float64)
            return s, (s if squares else None)
        if self.kind == "uniform" and not squares:
            return rng.binomial(m, 0.5, (trials, len(_DYADIC))) @ _DYADIC, None
        s = np.empty(trials)
        q = np.empty(trials) if squares else None
        rows = max(1, _BLOCK_ELEMENTS // m)
        for i in range(0, trials, rows):
            y = self.draw(rng, (min(rows, trials - i), m))
            s[i:i + len(y)] = y.sum(axis=1)
            if q is not None:
                q[i:i + len(y)] = np.einsum("ij,ij->i", y, y)
        return s, q


_BLOCK_ELEMENTS = 1 << 21  # values per block (16 MB of float64) when values must be drawn
