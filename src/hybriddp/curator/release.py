"""The curator's release: two documents that cross machines, bound to each other by hash.

* the **device head list** (``hybriddp-headlist`` v1, :mod:`hybriddp.core.headlist`): the lists and
  what a device needs to randomize (ε, δ, f_C, m_C), with a SHA-256 ``content_hash``. Devices
  download only this.
* the **opt-in estimates** (``hybriddp-optin-estimates`` v2): the curator's DP estimates over
  that head list (p̂_O per entry and per query, the draw counts J, |D_T|, Var Y), the
  parameters, the noise, public sizes; it names the head list's hash in ``headlist`` and has
  its own ``content_hash``. Only the server that blends reads it. Version 3 adds ``reused`` (1 for
  a record estimated from S ∪ T, ALGORITHM.md §4.1) and ``n_s`` = |D_S|; it is written only when S
  is reused, so releases without reuse stay version 2. ``s_corrected: true`` says S's counts were
  corrected for having passed τ (§4.1), which changes the records' variances; files without it pooled
  them as released and are blended as before. ``s_counts`` (with ``s_corrected``) holds S's released count of
  each reused record (the head-list release of §3.3, null elsewhere), from which the server estimates the
  correction's excess variance for the reported error (§4.1, "Reported variance").

A seeded release gives no privacy (its noise is reproducible by anyone who knows the seed): both
documents then say ``"non_private": true``. The head list carries the key only when seeded, so an
unseeded head list is byte for byte what it always was; the estimates always carry it (false when
unseeded) next to their ``seed`` (a publisher may withhold the seed itself: ``non_private`` stays true).

Everything in both is a function of the (ε, δ)-DP outputs and of public sizes (ALGORITHM.md
§3, §4); raw records never are. :func:`release_from_documents` validates both field by field
(the value, the field and the fix in every message) and rebuilds the in-memory release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybriddp.core.errors import DataError, HeadListError, HybridDPError
from hybriddp.core.estimators import LEGACY_ESTIMATOR, Release
from hybriddp.core.headlist import HeadList, from_device_json, validate_device_json
from hybriddp.core.noise import NOISE_LABELS
from hybriddp.core.params import BlenderParams
from hybriddp.core.protocol import content_hash
from hybriddp.core.records import Vocabulary
from hybriddp.core.rng import SEED_WARNING
from hybriddp.curator.estimates import OptinEstimates
from hybriddp.curator.kept import kept_count_for
from hybriddp.privacy.guarantees import Guarantee, curator_guarantees
from hybriddp.privacy.ledger import Charge

OPTIN_FORMAT = "hybriddp-optin-estimates"
OPTIN_VERSION = 2
OPTIN_VERSION_REUSE = 3
"""The version of a release whose records reuse S (ALGORITHM.md §4.1): version 2 plus ``reused``, ``n_s``."""


@dataclass
class CuratorRelease:
    """A curator round's output (ALGORITHM.md §2 lines 1–3): documents plus their in-memory form.

    ``headlist`` and ``estimates`` are the two JSON documents; ``head_list``, ``queries``,
    ``urls`` and ``optin`` are the same content, integer-coded, for the server function.
    ``guarantees`` states the round's privacy numerically; ``charges`` are the ledger charges of
    the opt-in users (empty for a release read back from documents: the server never learns who
    the opt-in users were).
    """

    headlist: dict[str, Any]
    estimates: dict[str, Any]
    head_list: HeadList
    queries: Vocabulary
    urls: Vocabulary
    optin: OptinEstimates
    params: BlenderParams
    noise: str
    seed: int | None
    charges: list[Charge] = field(default_factory=list)

    @property
    def url_level(self) -> bool:
        """False for a log without URLs (records are queries; devices spend f_C = 1)."""
        return bool(self.headlist.get("url_level", True))

    @property
    def f_c(self) -> float:
        """The f_C devices use (1 for a log without URLs)."""
        return float(self.headlist["f_c"])

    @property
    def m_c(self) -> int:
        """Reports per device."""
        return int(self.headlist["m_c"])

    @property
    def sizes(self) -> dict[str, int]:
        """Public sizes of the curator's round (opt-in users, |S|, |T|, |D_S|, |D_T|, |HL_S|)."""
        return dict(self.estimates.get("sizes", {}))

    @property
    def guarantees(self) -> tuple[Guarantee, ...]:
        """The curator's two releases (S: Theorem 1, T: Theorem 2) — what the ledger charges."""
        return curator_guarantees(float(self.headlist["epsilon"]), float(self.headlist["delta"]))

    @property
    def non_private(self) -> bool:
        """True for a seeded release: reproducible by anyone who knows the seed, no privacy at all."""
        return (self.seed is not None or self.headlist.get("non_private") is True
                or self.estimates.get("non_private") is True)

    @property
    def hash(self) -> str:
        """The head list's content hash: the round's identity for devices and ledgers."""
        return str(self.headlist["content_hash"])


def mark_non_private(headlist_doc: dict[str, Any]) -> dict[str, Any]:
    """The device head list of a seeded release: ``"non_private": true`` added and the hash recomputed, so
    that devices (which download only this document) can see that the release gives no privacy."""
    doc = {k: v for k, v in headlist_doc.items() if k != "content_hash"}
    doc["non_private"] = True
    doc["content_hash"] = content_hash(doc)
    return doc


def estimates_document(optin: OptinEstimates, headlist_doc: dict[str, Any], params: BlenderParams, noise: str,
                       seed: int | None, sizes: dict[str, int]) -> dict[str, Any]:
    """The opt-in estimates document, bound to ``headlist_doc`` and content-hashed; ``non_private`` is true
    exactly when ``seed`` is set (a seeded release gives no privacy)."""
    if noise not in NOISE_LABELS:
        raise DataError(f"noise = {noise!r}: unknown; use one of {', '.join(NOISE_LABELS)}")
    doc: dict[str, Any] = {
        "format": OPTIN_FORMAT, "version": OPTIN_VERSION if optin.reused is None else OPTIN_VERSION_REUSE,
        "headlist": headlist_doc["content_hash"],
        "n": int(optin.n), "noise_variance": float(optin.noise_variance),
        "p_record": [float(x) for x in optin.p_record.tolist()],
        "draws_record": [int(x) for x in optin.draws_record.tolist()],
        "p_query": [float(x) for x in optin.p_query.tolist()],
        "draws_query": [int(x) for x in optin.draws_query.tolist()],
        "params": params.to_dict(), "noise": noise, "seed": seed, "non_private": seed is not None,
        "sizes": {k: int(v) for k, v in sizes.items()},
    }
    if optin.reused is not None:
        doc.update(reused=[int(x) for x in optin.reused.tolist()], n_s=int(optin.n_s))
        if optin.kept is not None:  # S's counts corrected for having passed τ (ALGORITHM.md §4.1)
            doc["s_corrected"] = True
            if optin.s_counts is not None:  # the released counts of the reused records: their reported variance
                doc["s_counts"] = [float(x) if r else None for x, r in zip(optin.s_counts.tolist(),
                                                                          optin.reused.tolist(), strict=True)]
    if seed is not None:
        doc["warning"] = SEED_WARNING
    for key in ("p_record", "p_query"):
        if not all(math.isfinite(x) for x in doc[key]):
            raise DataError(f"opt-in estimates: {key} holds NaN or infinity; this is a bug, please report it")
    doc["content_hash"] = content_hash(doc)
    return doc


# ----- reading back ---------------------------------------------------------------------------
def _fail(source: str, name: str, value: Any, fix: str) -> DataError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return DataError(f"{source}: field {name!r} = {shown} is not valid: {fix}")


def _int(doc: dict[str, Any], name: str, source: str, lo: int) -> int:
    v = doc.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise _fail(source, name, v, f"it must be an integer ≥ {lo}; re-run `hybriddp headlist` to rewrite the file")
    return v


def _float(doc: dict[str, Any], name: str, source: str) -> float:
    v = doc.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise _fail(source, name, v, "it must be a finite number ≥ 0; re-run `hybriddp headlist` to rewrite the file")
    return float(v)


def _vector(doc: dict[str, Any], name: str, source: str, length: int, integer: bool) -> np.ndarray:
    v = doc.get(name)
    kind = "integers ≥ 1" if integer else "finite numbers"
    ok = isinstance(v, list) and len(v) == length and all(
        (isinstance(x, int) and not isinstance(x, bool) and x >= 1) if integer
        else (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)) for x in v)
    if not ok:
        got = f"a list of {len(v)}" if isinstance(v, list) else type(v).__name__
        raise _fail(source, name, v if not isinstance(v, list) else got,
                    f"it must be a list of {length} {kind} (one per head-list "
                    f"{'entry' if 'record' in name else 'query'}); pass the estimates file written with this "
                    "head list")
    return np.asarray(v, dtype=np.int64 if integer else np.float64)


def check_estimates_document(doc: Any, headlist_doc: dict[str, Any], hl: HeadList,
                             source: str = "opt-in estimates") -> dict[str, Any]:
    """Validate an opt-in estimates document field by field against its head list."""
    if not isinstance(doc, dict):
        raise DataError(f"{source}: expected a JSON object, found {type(doc).__name__}; pass the file "
                        "`hybriddp headlist --out-estimates` wrote")
    if doc.get("format") != OPTIN_FORMAT:
        raise _fail(source, "format", doc.get("format"), f"expected {OPTIN_FORMAT!r}; pass the file "
                    "`hybriddp headlist --out-estimates` wrote")
    if doc.get("version") not in (OPTIN_VERSION, OPTIN_VERSION_REUSE):
        raise _fail(source, "version", doc.get("version"), f"this hybriddp reads versions {OPTIN_VERSION} and "
                    f"{OPTIN_VERSION_REUSE}; re-run `hybriddp headlist` to write the estimates again")
    if doc.get("content_hash") != content_hash(doc):
        raise DataError(f"{source}: content_hash does not match the content; the file was altered or damaged. "
                        "Use the file `hybriddp headlist` wrote")
    if doc.get("headlist") != headlist_doc["content_hash"]:
        raise HeadListError(f"{source}: made for head list {str(doc.get('headlist'))[:19]}…, but the head list given "
                            f"is {headlist_doc['content_hash'][:19]}…; pass the two files `hybriddp headlist` wrote "
                            "together")
    n = _int(doc, "n", source, 0)
    _float(doc, "noise_variance", source)
    p_rec = _vector(doc, "p_record", source, hl.n_entries, False)
    j_rec = _vector(doc, "draws_record", source, hl.n_entries, True)
    if doc["version"] == OPTIN_VERSION_REUSE:
        _check_reuse(doc, source, hl, j_rec)
    p_q = _vector(doc, "p_query", source, hl.k, False)
    _vector(doc, "draws_query", source, hl.k, True)
    if n == 0 and (p_rec.any() or p_q.any()):  # an empty T gives all-zero estimates (ALGORITHM.md §4)
        raise _fail(source, "n", n, "n = 0 (no opt-in records in T) goes with all-zero estimates, but this file's "
                    "estimates are not zero; use the file `hybriddp headlist` wrote")
    if not isinstance(doc.get("noise"), str) or doc["noise"] not in NOISE_LABELS:
        raise _fail(source, "noise", doc.get("noise"), f"use one of {', '.join(NOISE_LABELS)}")
    seed = doc.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise _fail(source, "seed", seed, "it must be null or an integer ≥ 0")
    if "non_private" in doc and (not isinstance(doc["non_private"], bool)  # absent in older files
                                 or (seed is not None and not doc["non_private"])):
        raise _fail(source, "non_private", doc["non_private"], "it must be true or false, and true for a seeded "
                    f"release (seed = {seed!r}); use the file `hybriddp headlist` wrote")
    sizes = doc.get("sizes", {})
    if not isinstance(sizes, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                              for v in sizes.values()):
        raise _fail(source, "sizes", sizes, "it must be an object of counts ≥ 0")
    params = doc.get("params")
    if not isinstance(params, dict):
        raise _fail(source, "params", params, "it must be an object of BLENDER parameters")
    return doc


def _check_reuse(doc: dict[str, Any], source: str, hl: HeadList, draws: np.ndarray) -> None:
    """Version 3's fields: ``reused`` (0/1 per entry; a reused record sums two draws, S's and T's) and ``n_s``."""
    _int(doc, "n_s", source, 0)
    v = doc.get("reused")
    if not (isinstance(v, list) and len(v) == hl.n_entries and all(type(x) is int and x in (0, 1) for x in v)):
        got = f"a list of {len(v)}" if isinstance(v, list) else v
        raise _fail(source, "reused", got, f"it must be a list of {hl.n_entries} values 0 or 1 (one per head-list "
                    "entry); pass the estimates file written with this head list")
    reused = np.asarray(v, dtype=bool)
    if "s_corrected" in doc and not isinstance(doc["s_corrected"], bool):
        raise _fail(source, "s_corrected", doc["s_corrected"], "it must be true or false (whether S's counts were "
                    "corrected for having passed τ); use the file `hybriddp headlist` wrote")
    bad = np.flatnonzero(reused & ((draws < 2) | (hl.is_wildcard & (hl.entry_query == hl.k - 1))))
    if len(bad):
        raise _fail(source, "reused", f"entry {int(bad[0])}", "a reused record sums two noise draws (draws_record "
                    "≥ 2) and ⟨*,*⟩ is never reused; use the file `hybriddp headlist` wrote")
    if "s_counts" in doc:
        v = doc["s_counts"]
        if not (isinstance(v, list) and len(v) == hl.n_entries and all(
                (x is None) if not r else (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x))
                for x, r in zip(v, reused.tolist(), strict=False))):
            raise _fail(source, "s_counts", f"a list of {len(v)}" if isinstance(v, list) else v,
                        f"it must be a list of {hl.n_entries} values, S's released count of each reused record and "
                        "null elsewhere; use the file `hybriddp headlist` wrote")


def _params(doc: dict[str, Any], source: str) -> BlenderParams:
    known = set(BlenderParams.__dataclass_fields__)
    unknown = sorted(set(doc["params"]) - known)
    if unknown:
        raise _fail(source, "params", unknown, f"unknown parameter(s); known: {', '.join(sorted(known))}")
    try:  # a file written before the estimator field: the paper's
        return BlenderParams(**{"estimator": LEGACY_ESTIMATOR, **doc["params"]})
    except HybridDPError as exc:
        raise DataError(f"{source}: field 'params': {exc}") from None
    except TypeError as exc:  # a wrongly typed field, e.g. a string ε
        raise _fail(source, "params", doc["params"], f"a field has the wrong type ({exc})") from None


def check_headlist_budget(headlist_doc: dict[str, Any], source: str = "head list") -> None:
    """Refuse a (valid-looking) head list whose LocalAlg arithmetic would not stay finite and
    meaningful: ε whose e^{ε'} overflows, or an f_C so close to 0 or 1 that a per-report budget
    is lost in rounding (:func:`hybriddp.core.params.check_local_budget`, ALGORITHM.md §5)."""
    from hybriddp.core.params import check_local_budget

    try:
        check_local_budget(float(headlist_doc["epsilon"]), float(headlist_doc["f_c"]), int(headlist_doc["m_c"]),
                           bool(headlist_doc.get("url_level", True)))
    except HybridDPError as exc:
        raise HeadListError(f"{source}: {exc} (the head list's fields are what devices use; rebuild it with "
                            "`hybriddp headlist`)") from None


def _check_non_private(hdoc: dict[str, Any], edoc: dict[str, Any] | None, source: str) -> None:
    """The head list's ``non_private`` is absent or true (it is written only for a seeded release), and agrees with
    the estimates' (``edoc``; None: the head list alone)."""
    if "non_private" in hdoc and hdoc["non_private"] is not True:
        raise HeadListError(f"{source}: field 'non_private' = {hdoc['non_private']!r} is not valid: it is written "
                            "only for a seeded release, as true; rebuild the head list with `hybriddp headlist`")
    if edoc is not None and "non_private" in edoc and ("non_private" in hdoc) != edoc["non_private"]:  # older: absent
        raise HeadListError(f"{source}: the head list is {'' if 'non_private' in hdoc else 'not '}marked non_private "
                            f"but its estimates say non_private = {str(edoc['non_private']).lower()}; pass the two "
                            "files `hybriddp headlist` wrote together")


def release_from_documents(headlist_doc: Any, estimates_doc: Any, *, headlist_source: str = "head list",
                           estimates_source: str = "opt-in estimates") -> CuratorRelease:
    """Validate the two documents of a release and rebuild it (the server's view).

    Raises :class:`HeadListError` / :class:`DataError` naming the file, the field, the value
    and the fix.
    """
    hdoc = validate_device_json(headlist_doc, headlist_source)
    check_headlist_budget(hdoc, headlist_source)
    _check_non_private(hdoc, None, headlist_source)
    hl, qv, uv = from_device_json(hdoc)
    edoc = check_estimates_document(estimates_doc, hdoc, hl, estimates_source)
    params = _params(edoc, estimates_source)
    for name, want in (("epsilon", params.epsilon), ("delta", params.delta), ("m_c", params.m_c)):
        if hdoc[name] != want:
            raise HeadListError(f"{estimates_source}: params.{name} = {want!r} but the head list says {hdoc[name]!r}; "
                                "pass the two files `hybriddp headlist` wrote together")
    _check_non_private(hdoc, edoc, headlist_source)
    p_rec = np.asarray(edoc["p_record"], dtype=np.float64)
    j_rec = np.asarray(edoc["draws_record"], dtype=np.int64)
    p_q = np.asarray(edoc["p_query"], dtype=np.float64)
    j_q = np.asarray(edoc["draws_query"], dtype=np.int64)
    n, var_y = int(edoc["n"]), float(edoc["noise_variance"])
    reused = np.asarray(edoc["reused"], dtype=bool) if edoc["version"] == OPTIN_VERSION_REUSE else None
    if (params.estimator_spec.release is Release.REUSE_S) != (reused is not None):
        raise _fail(estimates_source, "params", {"estimator": params.estimator}, f"a version {edoc['version']} file "
                    f"{'does not reuse' if reused is None else 'reuses'} S, which estimator {params.estimator!r} "
                    f"{'needs' if reused is None else 'does not do'}; use the file `hybriddp headlist` wrote")
    n_s = int(edoc.get("n_s", 0))
    kept = None  # a file without s_corrected (written before the correction) pooled S's counts as released
    if reused is not None and edoc.get("s_corrected") is True:
        kept = kept_count_for(params.epsilon, params.delta, params.m_o, str(edoc["noise"]), n_s)
    s_counts = None  # without them (files written before), the reported variance uses the excess at the estimate
    if kept is not None and "s_counts" in edoc:
        s_counts = np.array([np.nan if x is None else x for x in edoc["s_counts"]], dtype=np.float64)
    optin = OptinEstimates(hl, p_rec, p_rec, j_rec, p_q, p_q, j_q, n, var_y, reused, n_s, s_counts, kept)
    optin.var_record, optin.var_query = optin.variances_at(p_rec, p_q)
    return CuratorRelease(hdoc, edoc, hl, qv, uv, optin, params, str(edoc["noise"]), edoc.get("seed"))
