"""The privatized inputs of ``hybriddp tune``: the two DP files ``hybriddp headlist`` writes, read and checked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybriddp.core.errors import DataError
from hybriddp.core.headlist import HeadList
from hybriddp.curator.estimates import OptinEstimates
from hybriddp.curator.release import CuratorRelease, release_from_documents
from hybriddp.io.exchange import read_release_files


@dataclass(frozen=True)
class PrivatizedInputs:
    """The DP outputs of ``hybriddp headlist``: the device head list and the opt-in estimates.

    Attributes
    ----------
    headlist : dict
        The validated head-list JSON (lists, ε, δ, f_C, m_C, content hash).
    estimates : dict
        The opt-in estimates JSON (p̂_O per entry and per query, |D_T|, noise, params, sizes).
    head_list : HeadList
        The integer-coded final head list.
    optin : OptinEstimates
        The estimates, with their variances (ALGORITHM.md §4).
    paths : tuple of str
        Where the two files were read from (for the output).
    """

    headlist: dict[str, Any]
    estimates: dict[str, Any]
    head_list: HeadList
    optin: OptinEstimates
    paths: tuple[str, str] = ("", "")

    @property
    def url_level(self) -> bool:
        """False for a single-item log (records are queries)."""
        return bool(self.headlist.get("url_level", True))

    @property
    def params(self) -> dict[str, Any]:
        """The curator's BLENDER parameters, as written in the estimates file."""
        return dict(self.estimates.get("params", {}))

    @property
    def sizes(self) -> dict[str, Any]:
        """The curator's sizes (|D_S|, |D_T|, |HL_S|, ...) as written in the estimates file."""
        return dict(self.estimates.get("sizes", {}))

    @property
    def listed_records(self) -> int:
        """Records of the final list (queries for a single-item log)."""
        return self.head_list.n_records if self.url_level else self.head_list.n_queries


def load_privatized(headlist_path: str | Path, estimates_path: str | Path) -> PrivatizedInputs:
    """Read and cross-check the two files ``hybriddp headlist`` writes.

    Parameters
    ----------
    headlist_path : the head-list JSON (``--out-headlist``).
    estimates_path : the opt-in estimates JSON (``--out-estimates``), made for that head list.

    Returns
    -------
    PrivatizedInputs

    Raises
    ------
    HeadListError, DataError
        Unreadable or malformed files, files made for different head lists, or estimates too
        incomplete to fit (no parameters, fewer than 3 listed records, |D_T| < 2).
    """
    hdoc, edoc = read_release_files(headlist_path, estimates_path)
    rel = release_from_documents(hdoc, edoc, headlist_source=str(headlist_path), estimates_source=str(estimates_path))
    return from_release(rel, (str(headlist_path), str(estimates_path)))


def from_release(rel: CuratorRelease, paths: tuple[str, str] = ("curator release", "curator release")
                 ) -> PrivatizedInputs:
    """The privatized inputs of an in-memory curator release (its two documents, no files)."""
    return _checked(PrivatizedInputs(rel.headlist, rel.estimates, rel.head_list, rel.optin, paths))


def _checked(inputs: PrivatizedInputs) -> PrivatizedInputs:
    where = inputs.paths[1]
    params = inputs.params
    for key in ("epsilon", "delta", "f_o"):
        if not isinstance(params.get(key), (int, float)):
            raise DataError(f"{where}: field params.{key} is missing; the file must be written by `hybriddp headlist`")
    if inputs.optin.n < 2:
        raise DataError(f"{where}: |D_T| = {inputs.optin.n}; at least 2 opt-in records are needed to fit a model. "
                        "Rerun `hybriddp headlist` with a larger opt-in group, or omit the files to use the prior")
    if inputs.listed_records < 3:
        raise DataError(f"{where}: the head list has {inputs.listed_records} records; at least 3 are needed to fit a "
                        "rank-frequency law. Rerun `hybriddp headlist` with a larger --head-list-size or opt-in "
                        "group, or omit --headlist/--optin-estimates to use the prior")
    return inputs
