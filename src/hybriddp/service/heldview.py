"""What an administrator needs to judge results the anchor check flagged (ALGORITHM.md §7.2, "Judging held
results"): per flagged entry the opt-in and device estimates, the test's z, p-value and Holm level, the estimated
number of fake reports that would explain the gap, and what publishing the results as they are (``keep``) or
without the flagged entries (``remove``) would publish; for a mean round the same for the one mean.

The view is part of the results document's ``anchor_check`` (stored at close), so ``hybriddp round close``, the
round page and ``GET /api/v1/rounds/{id}/results`` show the same numbers. Everything in it is a function of the
opt-in release, the report counts and public sizes: post-processing, no privacy cost (§7.2).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hybriddp.core.jsonfile import json_safe
from hybriddp.server.anchor import AnchorCheck


def blender_view(doc: dict[str, Any], check: AnchorCheck, removed: dict[str, Any]) -> dict[str, Any]:
    """``anchor_check`` additions of a BLENDER result ``doc``: ``flagged_entries`` (records and queries, largest
    |z| first) and the rows each choice publishes (``removed``: ``doc`` without its flagged entries)."""
    entries = []
    for level, side, table in (("record", check.records, doc["records"]), ("query", check.queries, doc["queries"])):
        for i in np.flatnonzero(side.flagged).tolist():
            row = table[i]
            record = level == "record"
            left_out = 1 if record else sum(r["query"] == row["query"] for r in doc["records"])
            entries.append({
                "level": level, "query": row["query"], "url": row["url"] if record else None,
                "p_optin": row["p_optin"] if record else row["p_optin_sum"],
                "p_client": row["p_client"] if record else row["p_client_direct"],
                "z": float(side.z[i]), "p_value": float(side.p_value[i]), "p_threshold": float(side.level[i]),
                "reports": float(side.reports[i]), "estimated_fake_reports": float(side.fakes[i]),
                "published_if_kept": row["p_blended"], "published_if_removed": None,
                "undefended": row["p_undefended"], "records_left_out_if_removed": left_out,
            })
    entries.sort(key=lambda e: -abs(e["z"]) if e["z"] is not None and math.isfinite(e["z"]) else 0.0)
    return json_safe({
        "flagged_entries": entries,
        "published_if_kept": {"records": len(doc["records"]), "queries": len(doc["queries"])},
        "published_if_removed": {"records": len(removed["records"]), "queries": len(removed["queries"])},
    })


def mean_view(mean_o: float, mean_c: float, n_c: int, low: float, high: float,
              published: float) -> dict[str, Any]:
    """``anchor_check`` additions of a mean round: the two means, the fewest extreme values that explain their gap
    and the hybrid mean each choice publishes. ``low``/``high``: the most extreme values the service accepts
    (:class:`hybriddp.service.rounds.MeanReports`). With n_C device values of which F sit at the extreme v and the
    rest average μ_O, μ̂_C − μ_O = F(v − μ_O)/n_C, so F̂ = n_C(μ̂_C − μ̂_O)/(v − μ̂_O): a fake anywhere else in
    [low, high] moves the mean less, so more fakes would be needed."""
    extreme = high if mean_c >= mean_o else low
    gap = extreme - mean_o
    fakes = n_c * (mean_c - mean_o) / gap if gap != 0 else math.nan
    return json_safe({
        "optin_mean": mean_o, "client_mean": mean_c, "extreme_value": extreme, "estimated_fake_values": fakes,
        "published_if_kept": published, "published_if_removed": None, "client_values": n_c,
    })
