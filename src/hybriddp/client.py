"""Deprecated alias of :mod:`hybriddp.sdk` (the HTTP SDK); it will be removed in the next release."""

import warnings

from hybriddp.sdk import *  # noqa: F403
from hybriddp.sdk import __all__  # noqa: F401

warnings.warn("hybriddp.client is deprecated: import from hybriddp.sdk", DeprecationWarning, stacklevel=2)
