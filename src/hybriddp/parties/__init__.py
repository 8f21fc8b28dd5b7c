"""The three parties of the hybrid model (paper Fig. 1), as plain functions and objects.

* **curator** (:mod:`hybriddp.parties.curator`): opt-in users' raw records + parameters →
  a :class:`~hybriddp.parties.curator.CuratorRelease`: the device head-list document and the
  opt-in estimates document, content-hashed and bound to each other, with the round's
  privacy guarantees and ledger charges (ALGORITHM.md §3, §4);
* **device** (:mod:`hybriddp.parties.device`): head-list document + the device's own records
  → one device message with a random message id (ALGORITHM.md §5);
* **server** (:mod:`hybriddp.parties.server`): release + device messages (or report counts)
  → the blended result (ALGORITHM.md §6, §7).

:func:`hybriddp.pipeline.run_blender` is their composition; the CLI commands ``headlist``,
``randomize`` and ``estimate``, the experiments and the collection service are thin callers.
"""

from hybriddp.parties.curator import curate
from hybriddp.parties.device import device_message
from hybriddp.parties.release import CuratorRelease, release_from_documents
from hybriddp.parties.server import ReportCounts, count_messages, serve_estimates

__all__ = [
    "CuratorRelease",
    "ReportCounts",
    "count_messages",
    "curate",
    "device_message",
    "release_from_documents",
    "serve_estimates",
]
