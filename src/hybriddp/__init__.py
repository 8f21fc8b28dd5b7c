"""hybriddp: the hybrid model of differential privacy, made practical.

BLENDER (Avent et al., USENIX Security 2017) heavy hitters over an opt-in group that trusts
the curator and clients that randomize locally. The algorithms are written out in the
repository's ``docs/ALGORITHM.md``; code comments cite its sections as "ALGORITHM.md §N".
"""

from hybriddp.errors import DataError, HeadListError, HybridDPError, ParameterError
from hybriddp.params import BlenderParams

__all__ = [
    "BlenderParams",
    "DataError",
    "HeadListError",
    "HybridDPError",
    "ParameterError",
]
__version__ = "0.1.0"
