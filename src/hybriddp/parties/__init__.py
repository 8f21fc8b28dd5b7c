"""Deprecated alias: the three parties' functions are ``hybriddp.curate``, ``hybriddp.device_message`` and
``hybriddp.serve_estimates`` (and their modules :mod:`hybriddp.curator.party`, :mod:`hybriddp.device.party`,
:mod:`hybriddp.server.party`); this module will be removed in the next release."""

import warnings

from hybriddp.curator.party import curate
from hybriddp.curator.release import CuratorRelease, release_from_documents
from hybriddp.device.party import device_message
from hybriddp.server.party import ReportCounts, count_messages, serve_estimates

warnings.warn("hybriddp.parties is deprecated: import curate, device_message, serve_estimates, ... from hybriddp",
              DeprecationWarning, stacklevel=2)

__all__ = ["CuratorRelease", "ReportCounts", "count_messages", "curate", "device_message", "release_from_documents",
           "serve_estimates"]
