"""hybriddp: the hybrid model of differential privacy, made practical.

BLENDER (Avent et al., USENIX Security 2017) heavy hitters over an opt-in group that trusts
the curator and clients that randomize locally; see ``SPEC.md`` sections 2-9 (referenced as
"SPEC §N" throughout the code).
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
