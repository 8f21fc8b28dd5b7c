"""The server (paper Fig. 1, Fig. 2 lines 4–5; ALGORITHM.md §6, §7).

* :func:`count_messages` checks device messages against the release's head list and counts
  their reports per entry: a message must name the head list's hash, carry a valid random
  message id and at most m_C reports over listed entries; a repeated message id is counted
  once (devices may retry), so counting is idempotent.
* :func:`server_side` turns report counts into client estimates and blends them with the
  opt-in estimates; :func:`serve_estimates` wraps that into a :class:`~hybriddp.server.result.Result`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hybriddp.core.errors import DataError, HeadListError
from hybriddp.core.estimators import Blend, estimator_named
from hybriddp.core.headlist import HeadList
from hybriddp.core.params import OPTION_NAMES
from hybriddp.core.protocol import ID_REGEX, DeviceError, check_message_id
from hybriddp.core.reportlaw import LocalAlgParams
from hybriddp.curator.release import CuratorRelease
from hybriddp.server.agree import agree_blend
from hybriddp.server.anchor import AnchorCheck, AnchorPolicy, anchor_blend
from hybriddp.server.blend import BlendOutput, blend_estimates
from hybriddp.server.client_estimates import ClientEstimates, estimate_client_probabilities
from hybriddp.server.result import BlendParts, Result


@dataclass
class ReportCounts:
    """Reports per head-list entry, and what counting saw."""

    counts: np.ndarray
    messages: int = 0
    reports: int = 0
    duplicates: int = 0  # messages dropped because their id was already counted


class MessageCounter:
    """Counts device messages for one release, dropping repeated message ids.

    Feed messages with :meth:`add` (one at a time, e.g. while reading a file or a request body);
    read :attr:`result`. ``source`` prefixes error messages (a file name and line, say).
    """

    def __init__(self, release: CuratorRelease,
                 refetch_hint: str = "devices must randomize over the head list being estimated") -> None:
        doc = release.headlist
        self.refetch_hint = refetch_hint
        self.release = release
        self.want = release.hash
        self.m_c = release.m_c
        queries = doc["queries"]
        hl = release.head_list
        self._entry: dict[tuple[Any, Any], int] = {(None, None): int(hl.url_offsets[hl.k - 1])}
        for i, q in enumerate(queries):
            base = int(hl.url_offsets[i])
            for j, u in enumerate(q["urls"]):
                self._entry[(q["query"], u)] = base + j
            self._entry[(q["query"], None)] = int(hl.url_offsets[i + 1] - 1)
        self._queries = {q["query"] for q in queries}
        self._seen: set[str] = set()
        self.result = ReportCounts(np.zeros(hl.n_entries, dtype=np.int64))

    @property
    def entry_map(self) -> dict[tuple[Any, Any], int]:
        """(query, url) of every report a device can send (None = wildcard) → its head-list entry."""
        return dict(self._entry)

    def entries(self, msg: Any, source: str = "device message") -> tuple[str, list[int]]:
        """(message id, head-list entry of each report) of one message, or the error naming the problem.

        A well-formed message takes a few dictionary lookups; anything else goes through the full
        checks one by one, and the first that fails raises :class:`DataError`/:class:`HeadListError`.
        """
        try:
            mid, reports = msg["id"], msg["reports"]
            if (type(mid) is str and ID_REGEX.fullmatch(mid) and msg["headlist"] == self.want and type(reports) is list
                    and len(reports) <= self.m_c and all(type(r) is dict for r in reports)):
                return mid, [self._entry[(rep["query"], rep["url"])] for rep in reports]
        except (TypeError, KeyError, IndexError):
            pass
        return self._explain(msg, source)

    def _explain(self, msg: Any, source: str) -> tuple[str, list[int]]:
        if not isinstance(msg, dict):
            raise DataError(f"{source}: expected a JSON object {{\"id\": ..., \"headlist\": ..., \"reports\": [...]}}, "
                            f"found {type(msg).__name__}")
        missing = [k for k in ("id", "headlist", "reports") if k not in msg]
        if missing:
            raise DataError(f"{source}: field {missing[0]!r} is missing; a device message is "
                            '{"id": ..., "headlist": ..., "reports": [{"query": ..., "url": ...}]} '
                            "(made by hybriddp.device.localalg.randomize_records)")
        try:
            mid = check_message_id(msg["id"])
        except DeviceError as exc:
            raise DataError(f"{source}: {exc}") from None
        if msg["headlist"] != self.want:
            raise HeadListError(f"{source}: report made for head list {str(msg['headlist'])[:19]}…, expected "
                                f"{self.want[:19]}…; {self.refetch_hint}")
        reports = msg["reports"]
        if not isinstance(reports, list):
            raise DataError(f"{source}: field 'reports' must be a list, found {type(reports).__name__}")
        if len(reports) > self.m_c:
            raise DataError(f"{source}: message {mid} has {len(reports)} reports but the head list allows m_C = "
                            f"{self.m_c} per device; a device sends at most m_C reports (refused: counting more "
                            "would break the devices' privacy accounting)")
        return mid, [self._entry_of(rep, source) for rep in reports]

    def add(self, msg: Any, source: str = "device message") -> bool:
        """Count one message; returns False when its id was already counted (dropped)."""
        mid, entries = self.entries(msg, source)
        if mid in self._seen:
            self.result.duplicates += 1
            return False
        self._seen.add(mid)
        for e in entries:
            self.result.counts[e] += 1
        self.result.messages += 1
        self.result.reports += len(entries)
        return True

    def _entry_of(self, rep: Any, source: str) -> int:
        if not isinstance(rep, dict) or "query" not in rep or "url" not in rep:
            raise DataError(f"{source}: a report must be {{\"query\": str or null, \"url\": str or null}}, "
                            f"found {str(rep)[:60]}")
        q, u = rep["query"], rep["url"]
        if not (q is None or isinstance(q, str)) or not (u is None or isinstance(u, str)):
            raise DataError(f"{source}: report fields must be strings or null, found query={q!r:.40}, url={u!r:.40}")
        e = self._entry.get((q, u))
        if e is None:
            if q is None:
                raise DataError(f"{source}: the wildcard query has only the wildcard URL (url null), found url={u!r}")
            if q not in self._queries:
                raise DataError(f"{source}: query {q!r} is not in the head list")
            raise DataError(f"{source}: URL {u!r} is not in the head list for query {q!r}")
        return e


def count_messages(release: CuratorRelease, messages: Iterable[Any], source: str = "device messages") -> ReportCounts:
    """Count an iterable of device messages (see :class:`MessageCounter`)."""
    counter = MessageCounter(release)
    for i, msg in enumerate(messages, 1):
        counter.add(msg, f"{source}, message {i}")
    return counter.result


@dataclass
class ServerOutput:
    """The server's estimates: LocalAlg constants, client estimates, blend (defended when ``check`` is set), and
    the anchor check (ALGORITHM.md §7.2; None: undefended)."""

    lp: LocalAlgParams
    client: ClientEstimates
    blended: BlendOutput
    check: AnchorCheck | None = None


DEFAULT_DEFENSE = AnchorPolicy()
"""What the server applies unless told otherwise: the anchor test and bound (ALGORITHM.md §7.2)."""


def server_side(release: CuratorRelease, counts: np.ndarray, project: bool, estimator: str = "paper",
                defense: AnchorPolicy | None = DEFAULT_DEFENSE) -> ServerOutput:
    """EstimateClientProbabilities (ALGORITHM.md §6) and BlendProbabilities (§7) from report counts,
    with the blend strategy of the estimator named ``estimator`` (:data:`hybriddp.core.estimators.REGISTRY`),
    then the opt-in anchor's test and bound (§7.2) unless ``defense`` is None, and last the agreement of the final
    columns (§7.3, :func:`~hybriddp.server.agree.agree_blend`): every published query at least the sum of its
    listed URLs. A defended round's ranking score is then the agreed estimate capped at p̂_O + κ_q·s again, with
    the κ_q the guard chose (§7.2, "The suggestions' ranking")."""
    hl = release.head_list
    doc = release.headlist
    lp = LocalAlgParams.build(hl, float(doc["epsilon"]), float(doc["delta"]), release.f_c, release.m_c)

    def estimate(c: np.ndarray, project: bool = False) -> tuple[ClientEstimates, BlendOutput]:
        client = estimate_client_probabilities(c, hl, lp, release.m_c)
        return client, blend_estimates(release.optin, client, project, estimator=estimator, lp=lp)
    consistent = estimator_named(estimator).blend is Blend.CONSISTENT
    if defense is None:
        client, blended = estimate(counts, project)
        return ServerOutput(lp, client, agree_blend(consistent_queries(blended, hl) if consistent else blended, hl))
    client, blended, check = anchor_blend(release.optin, lp, counts, defense, estimate, project)
    if consistent:  # queries stay the sums of their (defended) entries
        blended = consistent_queries(blended, hl)
        check = replace(check, queries=check.queries.guard(blended.queries_final, defense))
    blended = agree_blend(blended, hl)
    blended = replace(blended, queries_rank=check.queries.rank(blended.queries_final))
    return ServerOutput(lp, client, blended, check)


def consistent_queries(blended: BlendOutput, hl: HeadList) -> BlendOutput:
    """The blend with every query the sum of its entries (ALGORITHM.md §7.1, §7.2): the ``consistent`` estimator's
    promise kept after the anchor check and in what is published. The raw query (``p_blended_raw``) is the sum of
    its entries' raw (defended) blends; the published one (``p_blended``) the sum of its published entries, which
    the projection onto the simplex keeps in [0, 1] and at least its URLs' sum (§7.3); unprojected, the raw sum
    clipped into [0, 1]."""
    from dataclasses import replace

    sums = np.bincount(hl.entry_query, weights=blended.records.p, minlength=hl.k)
    queries = replace(blended.queries, p=sums)
    final = (np.clip(sums, 0.0, 1.0) if blended.records_projected is None
             else np.bincount(hl.entry_query, weights=blended.records_final, minlength=hl.k))
    return replace(blended, queries=queries, queries_final=final)


def serve_estimates(release: CuratorRelease, counts: ReportCounts | np.ndarray, *,
                    project: bool | None = None, estimator: str | None = None,
                    sizes: dict[str, int] | None = None,
                    defense: AnchorPolicy | None = DEFAULT_DEFENSE) -> Result:
    """The server's result: client estimates from ``counts``, blended with the release's opt-in estimates and
    checked against them (``defense``, ALGORITHM.md §7.2; None: the undefended blend of §7).

    ``project`` and ``estimator`` None use the release's parameters. Raises :class:`DataError` when there are no
    reports at all (nothing to estimate from the clients).
    """
    c = counts.counts if isinstance(counts, ReportCounts) else np.asarray(counts, dtype=np.int64)
    if c.shape != (release.head_list.n_entries,):
        raise DataError(f"report counts have shape {c.shape}; expected one count per head-list entry "
                        f"({release.head_list.n_entries})")
    if c.sum() == 0:
        raise DataError("no reports; nothing to estimate from the clients. Collect device messages "
                        "(`hybriddp randomize`) for this head list first")
    params = release.params
    made = params.estimator_spec
    asked = made if estimator is None else estimator_named(estimator, f"estimator ({OPTION_NAMES['estimator']})")
    if asked.release is not made.release:
        raise DataError(f"estimator {estimator!r}: this release's opt-in estimates were made with estimator "
                        f"{params.estimator!r}, which {'reuses' if made.reuses_s else 'does not reuse'} "
                        "S; whether S is reused is the curator's choice (ALGORITHM.md §4.1). Pick "
                        f"{' or '.join(made.alternatives())}, "
                        "or make the head list again with the estimator you want")
    overrides = {k: v for k, v in (("project", project), ("estimator", estimator)) if v is not None}
    if overrides:
        from dataclasses import replace
        params = replace(params, **overrides)
    out = server_side(release, c, params.project, params.estimator, defense)
    all_sizes = {**release.sizes, **(sizes or {}), "reports": out.client.n}
    if isinstance(counts, ReportCounts):
        all_sizes.update(messages=counts.messages, duplicate_messages=counts.duplicates)
    return Result.blender(params, release.head_list, release.queries, release.urls,
                          BlendParts(release.optin, out.client, out.blended, release.f_c, release.noise, out.check),
                          all_sizes, release.seed, release.url_level)
