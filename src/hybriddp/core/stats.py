"""Small statistics shared by the experiments and ``tune``: Student-t 95% intervals."""

from __future__ import annotations

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (table to 30, then a
    Cornish–Fisher expansion; error < 1e-3)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
