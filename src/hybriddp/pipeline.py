"""Deprecated alias of :mod:`hybriddp.simulation.pipeline` (``run_blender`` is also ``hybriddp.run_blender``);
it will be removed in the next release."""

import warnings

from hybriddp.simulation.pipeline import *  # noqa: F403
from hybriddp.simulation.pipeline import run_blender  # noqa: F401

warnings.warn("hybriddp.pipeline is deprecated: use hybriddp.run_blender or hybriddp.simulation.pipeline",
              DeprecationWarning, stacklevel=2)
