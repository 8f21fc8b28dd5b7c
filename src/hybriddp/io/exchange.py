"""Files that cross machines in the real workflow: curator → devices → server.

* head-list JSON (:mod:`hybriddp.headlist`): the lists devices randomize over;
* opt-in estimates JSON (``hybriddp-optin-estimates`` v1): the curator's DP estimates over
  the final head list, for the server that blends;
* device reports, JSON Lines: one device message per line,
  ``{"headlist": "sha256:…", "reports": [{"query": str|null, "url": str|null}, …]}``
  (``null`` is the wildcard ``*``); ``.gz`` accepted.

Only differentially private outputs are written here: raw opt-in records never are.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hybriddp.curator import OptinEstimates, optin_variance
from hybriddp.errors import DataError, HeadListError
from hybriddp.headlist import HeadList
from hybriddp.io.jsonfile import read_json

if TYPE_CHECKING:
    from hybriddp.params import BlenderParams
    from hybriddp.pipeline import CuratorOutput
    from hybriddp.records import RecordLog

OPTIN_FORMAT = "hybriddp-optin-estimates"
OPTIN_VERSION = 1


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def write_optin_estimates(path: str | Path, optin: OptinEstimates, headlist_doc: dict[str, Any],
                          extra: dict[str, Any]) -> None:
    """Save the curator's estimates, tied to the head list by its content hash."""
    doc = {
        "format": OPTIN_FORMAT, "version": OPTIN_VERSION,
        "headlist": headlist_doc["content_hash"],
        "n": optin.n, "noise_variance": optin.noise_variance,
        "p_record": optin.p_record.tolist(), "draws_record": optin.draws_record.tolist(),
        "p_query": optin.p_query.tolist(), "draws_query": optin.draws_query.tolist(),
        **extra,
    }
    Path(path).write_text(json.dumps(doc, indent=1, allow_nan=False))


def curator_release(log: RecordLog, params: BlenderParams, cur: CuratorOutput, n_optin: int,
                    seed: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two DP documents of a curator round (``hybriddp headlist``): the device head-list JSON
    and the extra fields of the opt-in estimates file (:func:`write_optin_estimates`).

    Everything in them is a function of the (ε, δ)-DP outputs and of public sizes; raw records
    are not. ``n_optin`` is the number of opt-in users; ``seed`` is recorded (with a warning).
    """
    from hybriddp.pipeline import client_f_c
    from hybriddp.rng import SEED_WARNING

    hl = cur.optin.head_list
    doc = hl.to_device_json(log.queries, log.urls, epsilon=params.epsilon, delta=params.delta,
                            f_c=client_f_c(params, log.has_urls), m_c=params.m_c, url_level=log.has_urls)
    extra: dict[str, Any] = {
        "params": params.to_dict(), "noise": cur.noise, "seed": seed,
        "sizes": {"optin_users": int(n_optin), "optin_users_s": cur.n_users_s,
                  "optin_users_t": cur.n_users_t, "records_s": len(cur.sampled_s),
                  "records_t": len(cur.sampled_t), "head_list_s_records": cur.head_list_s.n_records,
                  "head_list_s_queries": cur.head_list_s.n_queries},
    }
    if seed is not None:
        extra["warning"] = SEED_WARNING
    return doc, extra


def write_curator_files(headlist_path: str | Path, estimates_path: str | Path, doc: dict[str, Any],
                        optin: OptinEstimates, extra: dict[str, Any]) -> None:
    """Write a curator round's two DP files (as ``hybriddp headlist`` does): the device head list
    ``doc`` and the opt-in estimates tied to it (``doc``, ``extra`` from :func:`curator_release`)."""
    Path(headlist_path).write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")
    write_optin_estimates(estimates_path, optin, doc, extra)


def read_optin_estimates(path: str | Path, hl: HeadList, headlist_doc: dict[str, Any]) -> tuple[
        OptinEstimates, dict[str, Any]]:
    """Load estimates saved by :func:`write_optin_estimates` for the given head list."""
    p = Path(path)
    doc = read_json(p, "opt-in estimates", DataError)
    if not isinstance(doc, dict) or doc.get("format") != OPTIN_FORMAT or doc.get("version") != OPTIN_VERSION:
        raise DataError(f"{p}: not a {OPTIN_FORMAT} v{OPTIN_VERSION} file (written by `hybriddp headlist`)")
    if doc.get("headlist") != headlist_doc["content_hash"]:
        raise HeadListError(f"{p}: made for head list {doc.get('headlist')}, but the head list given has "
                            f"{headlist_doc['content_hash']}; pass the files `hybriddp headlist` wrote together")
    p_rec = np.asarray(doc["p_record"], dtype=np.float64)
    p_q = np.asarray(doc["p_query"], dtype=np.float64)
    if len(p_rec) != hl.n_entries or len(p_q) != hl.k:
        raise DataError(f"{p}: sizes do not match the head list ({len(p_rec)} entries vs {hl.n_entries})")
    j_rec = np.asarray(doc["draws_record"], dtype=np.int64)
    j_q = np.asarray(doc["draws_query"], dtype=np.int64)
    n, var_y = int(doc["n"]), float(doc["noise_variance"])
    est = OptinEstimates(hl, p_rec, optin_variance(p_rec, j_rec, n, var_y), j_rec,
                         p_q, optin_variance(p_q, j_q, n, var_y), j_q, n, var_y)
    return est, doc


def _open_text(path: Path, mode: str):
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def write_reports(path: str | Path, messages: Iterable[dict[str, Any]]) -> int:
    """Write device messages as JSON Lines; returns the number of reports written."""
    n = 0
    with _open_text(Path(path), "w") as fh:
        for msg in messages:
            fh.write(json.dumps(msg, ensure_ascii=False, separators=(",", ":")))
            fh.write("\n")
            n += len(msg["reports"])
    return n


def read_report_counts(path: str | Path, headlist_doc: dict[str, Any], hl: HeadList) -> np.ndarray:
    """Count reports per head-list entry; every message must name this head list's hash.

    A malformed line raises :class:`DataError` with the file and line number.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"reports file not found: {p}")
    queries = headlist_doc["queries"]
    qindex = {q["query"]: i for i, q in enumerate(queries)}
    uindex = [{u: j for j, u in enumerate(q["urls"])} for q in queries]
    star = hl.k - 1
    want = headlist_doc["content_hash"]
    counts = np.zeros(hl.n_entries, dtype=np.int64)
    cache: dict[tuple[Any, Any], int] = {}
    with _open_text(p, "r") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
                if msg["headlist"] != want:
                    raise HeadListError(
                        f"{p}, line {lineno}: report made for head list {msg['headlist']}, expected {want}; "
                        "devices must randomize over the head list being estimated")
                for rep in msg["reports"]:
                    key = (rep["query"], rep["url"])
                    e = cache.get(key)
                    if e is None:
                        e = _entry_of(key, qindex, uindex, hl, star)
                        cache[key] = e
                    counts[e] += 1
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise DataError(f"{p}, line {lineno}: not a device message ({type(exc).__name__}: {exc}); "
                                'expected {"headlist": ..., "reports": [{"query": ..., "url": ...}]}') from None
            except DataError as exc:
                raise DataError(f"{p}, line {lineno}: {exc}") from None
    return counts


def _entry_of(key: tuple[Any, Any], qindex: dict[str, int], uindex: list[dict[str, int]],
              hl: HeadList, star: int) -> int:
    q, u = key
    if q is None:
        if u is not None:
            raise DataError("the wildcard query has only the wildcard URL")
        return int(hl.url_offsets[star])
    qi = qindex.get(q)
    if qi is None:
        raise DataError(f"query {q!r} is not in the head list")
    if u is None:
        return int(hl.url_offsets[qi + 1] - 1)
    uj = uindex[qi].get(u)
    if uj is None:
        raise DataError(f"URL {u!r} is not in the head list for query {q!r}")
    return int(hl.url_offsets[qi] + uj)
