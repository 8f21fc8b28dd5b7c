"""The defended default on honest data (issue 40, ALGORITHM.md §7.2): at opt-in groups of 1,000, 2,000, 10,000 and
50,000 users, fresh populations each round (truth from the population's law, fixed seeds), the published estimates
(``p_blended_raw``, records and queries) are unbiased, their published variance (``var_blended``) is their mean
squared error, and they are as accurate as the undefended blend's (RMSE ≤ 1.15×).

The instrument is :func:`hybriddp.simulation.defended_calibration.calibrate_defended`
(tests/test_defended_calibration.py checks it against the undefended blend); ``benchmarks/anchor_calibration.py``
runs it with more rounds. ``p_blended`` is ``p_blended_raw`` projected (records) or clipped (queries) into [0, 1],
biased upward where the true mass is near 0, as the undefended blend's.

*Band.* Each entry's reported variance over its empirical MSE lies in [0.8, 1.25], to within 4 of the ratio's own
standard errors (a few hundred rounds measure it to ~10%). Where the undefended blend's own ratio is outside the band
(⟨q,*⟩ entries whose true mass is 0, whose variance the estimator over-reports), the defended ratio may be as far out
as the undefended one, no further.
"""

from __future__ import annotations

import numpy as np
import pytest

from hybriddp.simulation.defended_calibration import calibrate_defended

SIZES = [(1_000, None, 200), (2_000, None, 200), (10_000, None, 150), (50_000, 400_000, 80)]
"""(opt-in users, all users (None: 20 × opt-in), rounds)."""


@pytest.mark.parametrize(("n_optin", "n_users", "rounds"), SIZES)
def test_the_defended_default_is_calibrated_and_as_accurate_as_the_blend(n_optin: int, n_users: int | None,
                                                                         rounds: int) -> None:
    cal = calibrate_defended(n_optin, n_users=n_users, rounds=rounds, seed=40, defenses=("anchor", None))
    for level in ("records", "queries"):
        d = cal.entries("anchor", level, "p_blended_raw")
        u = cal.entries("none", level, "p_blended_raw")
        assert np.array_equal(d["key"], u["key"])
        worst = np.abs(d["z"]).max()
        assert worst <= 4.0, f"{level}: bias z {worst:.1f} at {d['label'][np.argmax(np.abs(d['z']))]}"
        hi = np.maximum(1.25, u["ratio"]) + 4 * d["ratio_se"]
        lo = np.minimum(0.8, u["ratio"]) - 4 * d["ratio_se"]
        bad = (d["ratio"] > hi) | (d["ratio"] < lo)
        assert not bad.any(), (level, list(zip(d["label"][bad], d["ratio"][bad], d["ratio_se"][bad], strict=True)))
        rmse = cal.rmse("anchor", level, "p_blended_raw") / cal.rmse("none", level, "p_blended_raw")
        assert rmse <= 1.15, f"{level}: RMSE {rmse:.3f} × the undefended blend's"
