"""Randomness sources.

Production randomness comes from the operating system: :func:`make_rng` with ``seed=None``
seeds NumPy's PCG64 from :mod:`secrets` (128 bits of OS entropy). A ``seed`` exists for
reproducible experiments only: a seeded run's noise is predictable by anyone who knows the
seed, so it gives **no privacy**; outputs of seeded runs say so (:data:`SEED_WARNING`).

The curator's noise classes (:class:`hybriddp.noise.NoiseSource`) live in :mod:`hybriddp.noise`.
"""

from __future__ import annotations

import secrets

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
