"""Randomness and noise sources.

Production randomness comes from the operating system: :func:`make_rng` with ``seed=None``
seeds NumPy's PCG64 from :mod:`secrets` (128 bits of OS entropy). A ``seed`` exists for
reproducible experiments only: a seeded run's noise is predictable by anyone who knows the
seed, so it gives **no privacy**; outputs of seeded runs say so (:data:`SEED_WARNING`).

Noise on counts is drawn through the :class:`NoiseSource` interface so that exact discrete
noise can replace floating-point Laplace without touching the algorithms.
"""

from __future__ import annotations

import secrets
from typing import Protocol

import numpy as np

SEED_WARNING = (
    "seeded run: the randomness is reproducible, so this output is for experiments only "
    "and carries no privacy guarantee"
)

# Named sub-streams: each stage of BLENDER draws from its own child of the run's seed, so a
# stage run on its own (e.g. `hybriddp headlist`) reproduces the same draws as in `run`.
STREAMS = ("partition", "split", "sample_optin", "sample_clients", "headlist_noise",
           "optin_noise", "randomizer", "local_split", "local_discovery")
# Append new streams at the end only: a stream's draws depend on its index in this tuple.


def make_rng(seed: int | None = None) -> np.random.Generator:
    """A NumPy generator: OS-seeded when ``seed`` is None, else reproducible (experiments)."""
    if seed is None:
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    return np.random.Generator(np.random.PCG64(seed))


def stage_rng(seed: int | None, stage: str) -> np.random.Generator:
    """The generator of one named stage (see :data:`STREAMS`).

    With a seed, stage ``s`` uses ``SeedSequence(seed).spawn(len(STREAMS))[index(s)]``, so
    the same seed gives the same draws for that stage whichever command runs it.
    """
    if stage not in STREAMS:
        raise ValueError(f"unknown random stream {stage!r}; known: {', '.join(STREAMS)}")
    if seed is None:
        return make_rng(None)
    child = np.random.SeedSequence(seed).spawn(len(STREAMS))[STREAMS.index(stage)]
    return np.random.Generator(np.random.PCG64(child))


class NoiseSource(Protocol):
    """Noise added to counts by the curator (ALGORITHM.md §3, §4).

    ``name`` labels outputs; ``variance(scale)`` is the variance of one draw, used by the
    variance formulas (ALGORITHM.md §4), and ``survival(x, scale)`` is P[Y > x], used to check the
    head-list threshold.
    """

    name: str

    def sample(self, scale: float, size: int) -> np.ndarray:
        """``size`` independent draws with the given scale, as float64."""
        ...

    def variance(self, scale: float) -> float:
        """Variance of one draw."""
        ...

    def survival(self, x: float, scale: float) -> float:
        """P[Y > x] for one draw."""
        ...

    def head_list_threshold(self, epsilon: float, delta: float, m_o: int) -> float:
        """CreateHeadList's τ for this noise (ALGORITHM.md §3)."""
        ...


class LaplaceNoise:
    """Continuous Laplace(0, b) noise, as in the paper (floating point)."""

    name = "laplace"
    label = "laplace (continuous, floating point, paper-faithful)"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def sample(self, scale: float, size: int) -> np.ndarray:
        """Laplace(0, scale) draws."""
        return self.rng.laplace(0.0, scale, size)

    def variance(self, scale: float) -> float:
        """Var = 2b²."""
        return 2.0 * scale * scale

    def survival(self, x: float, scale: float) -> float:
        """P[Y > x] = ½e^{−x/b} for x ≥ 0, 1 − ½e^{x/b} otherwise."""
        if x >= 0:
            return 0.5 * float(np.exp(-x / scale))
        return 1.0 - 0.5 * float(np.exp(x / scale))

    def head_list_threshold(self, epsilon: float, delta: float, m_o: int) -> float:
        """τ = b_S·(ln(e^{ε/2} + m_O − 1) − ln δ) (Fig. 3 line 2)."""
        from hybriddp.params import head_list_threshold

        return head_list_threshold(epsilon, delta, m_o)
