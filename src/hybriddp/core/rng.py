"""Randomness sources.

Production randomness comes from the operating system: :func:`make_rng` with ``seed=None``
seeds NumPy's PCG64 from :mod:`secrets` (128 bits of OS entropy). A ``seed`` exists for
reproducible experiments only: a seeded run's noise is predictable by anyone who knows the
seed, so it gives **no privacy**; outputs of seeded runs say so (:data:`SEED_WARNING`).

The curator's exact discrete noise needs only uniform integers: with no generator given it draws
them straight from the OS CSPRNG through :class:`SecretsIntegers`. The noise classes themselves
(:class:`hybriddp.core.noise.NoiseSource`) live in :mod:`hybriddp.core.noise`.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np

from hybriddp.core.errors import parameter_error

SEED_WARNING = (
    "seeded run: the randomness is reproducible, so this output is for experiments only "
    "and carries no privacy guarantee"
)

# Named sub-streams: each stage of BLENDER draws from its own child of the run's seed, so a
# stage run on its own (e.g. `hybriddp headlist`) reproduces the same draws as in `run`.
STREAMS = ("partition", "split", "sample_optin", "sample_clients", "headlist_noise",
           "optin_noise", "randomizer", "local_split", "local_discovery", "demo_collecting")
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


class SecretsIntegers:
    """Uniform integers straight from the OS CSPRNG, one :func:`secrets.randbelow` call per draw.

    Offers the one call the exact samplers of :mod:`hybriddp.core.noise` make on a NumPy generator,
    ``integers(low, high, size=None)``: independent uniform draws from {low, ..., high − 1} as
    int64, where ``low`` and ``high`` may be arrays (broadcast together, then to ``size``). A
    Python call per draw (about 2 µs): meant for the curator's noise, a few draws per noisy
    count, not for bulk simulation.
    """

    def integers(self, low: int | np.ndarray, high: int | np.ndarray,
                 size: int | tuple[int, ...] | None = None) -> np.ndarray:
        """Uniform integers in [low, high), elementwise."""
        lows, highs = np.broadcast_arrays(np.asarray(low, dtype=np.int64), np.asarray(high, dtype=np.int64))
        if size is not None:
            lows, highs = np.broadcast_to(lows, size), np.broadcast_to(highs, size)
        if (highs <= lows).any():
            raise parameter_error("integers(low, high)", (low, high), "high > low in every element")
        pairs = zip(lows.ravel().tolist(), highs.ravel().tolist(), strict=True)
        draws = [lo + secrets.randbelow(hi - lo) for lo, hi in pairs]
        return np.array(draws, dtype=np.int64).reshape(lows.shape)


def hash_seed(*parts: object) -> int:
    """A 63-bit seed hashed from ``parts`` (joined by ``|``): independent streams per purpose."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
