"""hybriddp's version (the package face re-exports it as ``hybriddp.__version__``)."""

__version__ = "0.1.0"
