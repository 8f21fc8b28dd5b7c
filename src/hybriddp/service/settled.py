"""SQLite: which message ids may already be settled in ``messages``, known without asking the table.

Every new message must be checked against ``messages``' primary key (a retried message may have
been settled there already). In SQL that is one B-tree descent per message, about 3 µs, more than
the append itself, and it is paid in the writer thread, which is the service's one serial part.
:class:`SettledIds` keeps, per round, the sorted 64-bit hashes (Python's ``hash`` of the id
string, this process's own) of the ids in ``messages``. An id whose hash is not among them is
certainly not settled and is appended without the probe; the few whose hash is there (retries, or
a hash collision) still get the probe. A wrong "certainly new" would double-count, so the set is
trusted only when it provably holds every settled id:

* it is loaded from ``messages`` inside a write transaction (SQLite's write lock: nothing moves
  meanwhile), and afterwards only the ids of settles *this process committed* are added to it, so
  every hash held is that of an id in ``messages`` (ids are never removed from ``messages`` while
  the round exists);
* before each use, again under the write lock, the number of ids it was built from must equal the
  round's settled messages: ``rounds.n_messages`` (every stored message, counted in the
  transaction that stored it) minus the round's rows in ``messages_recent`` (exact after
  :meth:`hybriddp.service.recent.RecentIds.catch_up`). A subset of the settled ids with as many
  ids as there are settled ids *is* the settled ids. Otherwise (another ``serve --workers``
  process settled, a restart, a settle whose merge raced a reload) it is loaded again.

Memory: 8 bytes per settled message of an open round (40 MB at 5,000,000). Loading reads the
round's ids once (about a second per 2,500,000).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from sqlalchemy.engine import Connection


def id_hashes(ids: Iterable[str], count: int) -> np.ndarray:
    """This process's 64-bit hash of each id (str hashes are cached on the string: cheap)."""
    return np.fromiter(map(hash, ids), dtype=np.int64, count=count)


class SettledIds:
    """Sorted hashes of each round's ids in ``messages`` (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hashes: dict[int, np.ndarray] = {}
        self._count: dict[int, int] = {}  # ids the hashes were built from (collisions included)
        self._generation = 0  # incremented by every load: a settle's merge is skipped after one

    @property
    def generation(self) -> int:
        """Read before a settle's transaction and handed to :meth:`merge` after its commit."""
        with self._lock:
            return self._generation

    def maybe_settled(self, conn: Connection, round_num: int, settled: int, ids: Sequence[str]) -> np.ndarray:
        """Inside a write transaction: False for each id certainly not in ``messages`` (round
        ``round_num`` has ``settled`` messages there), True for those that may be."""
        with self._lock:
            hashes, count = self._hashes.get(round_num), self._count.get(round_num)
        if hashes is None or count != settled:
            rows = conn.exec_driver_sql("SELECT message_id FROM messages WHERE round_num = ?",
                                        (int(round_num),)).scalars().all()
            if len(rows) != settled:  # counts that disagree with the table: trust nothing, probe every id
                return np.ones(len(ids), dtype=bool)
            hashes = np.sort(id_hashes(rows, len(rows)))
            with self._lock:
                self._hashes[round_num], self._count[round_num] = hashes, len(rows)
                self._generation += 1
        if len(hashes) == 0:
            return np.zeros(len(ids), dtype=bool)
        probe = id_hashes(ids, len(ids))
        at = np.minimum(np.searchsorted(hashes, probe), len(hashes) - 1)
        return hashes[at] == probe

    def merge(self, moved: Mapping[int, Sequence[str]], generation: int) -> None:
        """After this process's settle committed: its ``moved`` ids (by round) are in ``messages`` now.
        Skipped when a load happened since ``generation`` (that load already saw them)."""
        with self._lock:
            if generation != self._generation:
                return
            for num, ids in moved.items():
                old = self._hashes.get(num)
                if old is None or not ids:
                    continue
                new = np.sort(id_hashes(ids, len(ids)))
                self._hashes[num] = np.insert(old, np.searchsorted(old, new), new)
                self._count[num] += len(ids)
