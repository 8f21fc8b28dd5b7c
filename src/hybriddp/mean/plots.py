"""The paper's Figures 1 and 2 (MSE vs n, R vs n) as PNG files (matplotlib Agg), written atomically."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hybriddp.core.atomic import atomic_path, check_output_path
from hybriddp.mean.analysis import crossover_n, improvement, mse_full_lm, mse_hybrid_optimal, mse_only_tcm
from hybriddp.mean.inputs import _fraction


def _save(fig: Any, path: str | Path) -> None:
    """Write ``fig`` through :mod:`hybriddp.core.atomic` (temporary file, rename), in the format of the name."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt)


def _n_grid(n_min: float, n_max: float, c: float, points: int = 1500) -> np.ndarray:
    lo = max(float(n_min), 2.0 / c, 2.0 / (1.0 - c))
    return np.logspace(math.log10(lo), math.log10(max(float(n_max), lo * 10)), points)


def plot_mse_vs_n(path: str | Path, *, epsilon: float, optin_fraction: float, sigma2: float, width: float = 1.0,
                  n_min: float = 10.0, n_max: float = 1e6, subtitle: str = "") -> dict[str, Any]:
    """Paper Fig. 1: MSE_F, MSE_T and MSE_H(w*) against n, log–log, as a PNG (matplotlib Agg).

    Returns where OnlyTCM overtakes FullLM and where R peaks.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    check_output_path(path, "path", (".png", ".pdf", ".svg"))
    c = float(_fraction(optin_fraction))
    kw = {"epsilon": epsilon, "sigma2": sigma2, "width": width}
    n = _n_grid(n_min, n_max, c)
    f = mse_full_lm(n, epsilon=epsilon, width=width)
    t = mse_only_tcm(n, c, **kw)
    h = mse_hybrid_optimal(n, c, **kw)
    r = np.minimum(f, t) / h
    fig = Figure(figsize=(7.5, 5.0), dpi=130, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.loglog(n, f, label="FullLM  (everyone local)", color="#1f77b4", lw=2)
    ax.loglog(n, t, label="OnlyTCM  (opt-in users only)", color="#ff7f0e", lw=2)
    ax.loglog(n, h, label="Hybrid  (optimal weight w*)", color="#2ca02c", lw=2.5)
    i = int(np.argmax(r))
    ax.axvline(n[i], color="grey", ls=":", lw=1)
    ax.plot([n[i]], [h[i]], "o", color="#2ca02c", ms=5)
    ax.annotate(f"largest gain over the better benchmark:\nR = {r[i]:.2f} at n ≈ {n[i]:,.0f}", (n[i], h[i]),
                xytext=(-40, -75), textcoords="offset points", ha="right", fontsize=9,
                arrowprops={"arrowstyle": "->", "color": "grey"})
    ax.set_xlabel("number of users n")
    ax.set_ylabel("expected squared error of the mean")
    ax.set_title(f"Fig. 1 — error vs n  (ε = {epsilon:g}, opt-in c = {c:.3g}, Δ = {width:g}, σ² = {sigma2:.4g})"
                 + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.12)
    ax.legend(frameon=False)
    _save(fig, path)
    cross = crossover_n(c, epsilon=epsilon, sigma2=sigma2, width=width)
    return {"path": str(path), "r_max": float(r[i]), "n_at_r_max": float(n[i]),
            "n_tcm_beats_lm": cross if math.isfinite(cross) else None}


def plot_improvement_vs_n(path: str | Path, *, epsilon: float, optin_fractions: Sequence[float], sigma2: float,
                          width: float = 1.0, n_min: float = 10.0, n_max: float = 1e6,
                          highlight: float | None = None, subtitle: str = "") -> list[dict[str, Any]]:
    """Paper Fig. 2: R = min(MSE_F, MSE_T)/MSE_H(w*) against n for several opt-in rates (PNG).

    Returns the largest R of each curve and where it is; ``interior`` is False when R still
    grows at ``n_max`` (when σ²(1−c)/c ≥ 2Δ²/ε², OnlyTCM never overtakes FullLM).
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    check_output_path(path, "path", (".png", ".pdf", ".svg"))
    fig = Figure(figsize=(7.5, 5.0), dpi=130, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    peaks = []
    cmap = matplotlib.colormaps["viridis"]
    cs = sorted({float(_fraction(c)) for c in optin_fractions})
    for j, c in enumerate(cs):
        n = _n_grid(n_min, n_max, c)
        r = improvement(n, c, epsilon=epsilon, sigma2=sigma2, width=width)
        i = int(np.argmax(r))
        interior = i < len(n) - 1  # else R still grows at n_max: OnlyTCM never overtakes FullLM here
        peaks.append({"optin_fraction": c, "r_max": float(r[i]), "n_at_r_max": float(n[i]), "interior": interior})
        bold = highlight is not None and math.isclose(c, highlight)
        color = cmap(j / max(1, len(cs) - 1) * 0.9)
        label = (f"c = {c:.3g}  (peak {r[i]:.2f} at n ≈ {n[i]:,.0f})" if interior
                 else f"c = {c:.3g}  (still rising: {r[i]:.2f} at n = {n[i]:,.0f})")
        ax.semilogx(n, r, color=color, lw=3 if bold else 1.6, label=label)
        if interior:
            ax.plot([n[i]], [r[i]], "o", color=color, ms=4)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(2.0, color="grey", ls="--", lw=0.8)
    ax.set_ylim(0.9, max(2.2, max(p["r_max"] for p in peaks) * 1.05))
    ax.set_xlabel("number of users n")
    ax.set_ylabel("improvement R = min(MSE_F, MSE_T) / MSE_H(w*)")
    ax.set_title(f"Fig. 2 — gain of Hybrid over the better benchmark  (ε = {epsilon:g}, Δ = {width:g}, "
                 f"σ² = {sigma2:.4g})" + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    ax.grid(True, which="major", alpha=0.4)
    ax.legend(frameon=False, fontsize=9, loc="upper right")
    _save(fig, path)
    return peaks
