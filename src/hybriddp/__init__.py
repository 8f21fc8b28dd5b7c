"""hybriddp: the hybrid model of differential privacy, made practical.

BLENDER (Avent et al., USENIX Security 2017) heavy hitters over an opt-in group that trusts
the curator and clients that randomize locally. The three parties of the paper's Fig. 1 are
:func:`curate` (the curator), :func:`device_message` (a device) and :func:`serve_estimates` (the
server); :func:`run_blender` composes them on a log. The algorithms are written out in the
repository's ``docs/ALGORITHM.md`` and the layout in ``docs/ARCHITECTURE.md``.
"""

from typing import Any

from hybriddp.core.errors import DataError, HeadListError, HybridDPError, ParameterError
from hybriddp.core.params import BlenderParams
from hybriddp.core.version import __version__

_PUBLIC = {  # name → module, imported on first use (``import hybriddp`` stays light)
    "curate": "hybriddp.curator.party", "CuratorRelease": "hybriddp.curator.release",
    "release_from_documents": "hybriddp.curator.release", "device_message": "hybriddp.device.party",
    "serve_estimates": "hybriddp.server.party", "count_messages": "hybriddp.server.party",
    "ReportCounts": "hybriddp.server.party", "run_blender": "hybriddp.simulation.pipeline",
    "ESTIMATORS": "hybriddp.core.params",
}

__all__ = ["BlenderParams", "DataError", "HeadListError", "HybridDPError", "ParameterError", "__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        import importlib
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'hybriddp' has no attribute {name!r}")
