"""A calibration of the machine a benchmark runs on, so that its figures can be checked on another machine.

The same code gives different absolute figures on different machines of the same kind (another CPU model,
another clock, a busy neighbour on shared cores). Every benchmark in this folder therefore times two fixed
workloads in the same run, before its own measurements, and prints its timing figures also as ratios to them:

* the **python unit** (``python_s``): a fixed pure-Python loop of integer arithmetic and dict look-ups and
  stores (:func:`python_workload`, 0.10–0.15 s on an AMD EPYC vCPU): what interpreter-bound code (per-record
  loops, request handling, test runs) scales with;
* the **numpy unit** (``numpy_s``): ``np.bincount`` over 10⁷ fixed integers (a seeded 2·10⁶-element array,
  counted five times) plus a sort of 2·10⁶ fixed floats (:func:`numpy_workload`, 0.13–0.2 s there): what vectorized,
  memory-bound code scales with.

How to read the ratios: a duration ``t`` seconds is printed as ``t / unit`` ("how many calibration workloads
long", :func:`relative`), a rate ``r`` per second as ``r · unit`` ("items per calibration workload",
:func:`rate_relative`). As far as a benchmark's work scales with its unit's workload, two machines running the
same code agree on these ratios where their seconds differ: a figure measured elsewhere is checked by comparing
its ratio with the ratio measured here, not its seconds. Each benchmark says which unit a figure is given in (the
one whose kind of work dominates it).

Each workload is run ``repeats`` times (interleaved) and the **best** (minimum) time is kept: on a shared
machine the disturbances only ever add time, so the minimum is the least-disturbed measurement of the machine's
speed. The inputs are made from a fixed seed outside the timed part; the calibration allocates ~50 MB for a
moment and takes about ``repeats`` × 0.3 s.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import numpy as np

PYTHON_STEPS = 500_000
"""Iterations of :func:`python_workload`."""
NUMPY_COUNT = 2_000_000
"""Length of the integer array :func:`numpy_workload` counts (``NUMPY_PASSES`` times) and of the float array it
sorts."""
NUMPY_PASSES = 5
NUMPY_BINS = 1 << 16
SEED = 41
"""Seed of the NumPy workload's inputs: the same numbers on every machine."""
KINDS = ("python", "numpy")


def python_workload(steps: int = PYTHON_STEPS) -> int:
    """The fixed pure-Python workload: ``steps`` rounds of integer arithmetic and dict get/set; a checksum."""
    table: dict[int, int] = {}
    acc = 0
    for i in range(steps):
        k = (i * 40503) & 4095
        v = table.get(k, 0) + (i ^ acc)
        table[k] = v & 0xFFFFFFFF
        acc = (acc + v) & 0xFFFFFFFF
    return acc


def numpy_inputs(n: int = NUMPY_COUNT, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """The NumPy workload's fixed inputs: ``n`` integers in [0, 2¹⁶) (``intp``, so counting copies nothing) and
    ``n`` floats in [0, 1), from a seeded generator."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, NUMPY_BINS, size=n, dtype=np.intp), rng.random(n)


def numpy_workload(ints: np.ndarray, floats: np.ndarray, passes: int = NUMPY_PASSES) -> int:
    """The fixed NumPy workload: ``np.bincount`` of ``ints`` ``passes`` times, then a sort of ``floats``; a
    checksum."""
    total = 0
    for _ in range(passes):
        total += int(np.bincount(ints, minlength=NUMPY_BINS)[::97].sum())
    return total + int(np.sort(floats)[len(floats) // 2] * 1e6)


def _processor() -> str:
    """The CPU model: ``platform.processor()``, else the first "model name" of /proc/cpuinfo, else ""."""
    name = platform.processor()
    if name and name != platform.machine():
        return name
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def calibrate(repeats: int = 5) -> dict[str, Any]:
    """Time both workloads ``repeats`` times (interleaved) and keep the best of each.

    Returns ``python_s`` and ``numpy_s`` (seconds of one workload: the calibration units, > 0), ``repeats``,
    and the Python and NumPy versions, the CPU count, the platform's machine and processor (a dict that goes
    into a benchmark's JSON as is). Cost: about ``repeats`` × 0.3 s.
    """
    if repeats < 1:
        raise ValueError(f"repeats = {repeats}: must be at least 1")
    ints, floats = numpy_inputs()
    best = {k: float("inf") for k in KINDS}
    for _ in range(repeats):
        t = time.perf_counter()
        python_workload()
        best["python"] = min(best["python"], time.perf_counter() - t)
        t = time.perf_counter()
        numpy_workload(ints, floats)
        best["numpy"] = min(best["numpy"], time.perf_counter() - t)
    return {"python_s": best["python"], "numpy_s": best["numpy"], "repeats": repeats,
            "python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count(),
            "machine": platform.machine(), "processor": _processor()}


def print_calibration(cal: Mapping[str, Any], file: TextIO | None = None) -> None:
    """Print the calibration as one line (to ``file``, default stdout; JSON-printing benchmarks pass stderr)."""
    print(f"machine: python workload {cal['python_s'] * 1e3:.0f} ms, numpy workload {cal['numpy_s'] * 1e3:.0f} ms "
          f"(best of {cal['repeats']}); figures below also in units of these", file=file or sys.stdout, flush=True)


def _unit(cal: Mapping[str, Any], kind: str) -> float:
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: expected one of {KINDS}")
    return float(cal[kind + "_s"])


def relative(seconds: float, cal: Mapping[str, Any], kind: str = "numpy") -> float:
    """A duration as a multiple of the machine's ``kind`` workload: ``seconds / cal[kind + "_s"]``."""
    return seconds / _unit(cal, kind)


def rate_relative(rate_per_s: float, cal: Mapping[str, Any], kind: str = "numpy") -> float:
    """A rate (items per second) as items per ``kind`` workload: ``rate_per_s * cal[kind + "_s"]``.

    The inverse of :func:`relative` for rates: ``rate_relative(n / t, cal) == n / relative(t, cal)``.
    """
    return rate_per_s * _unit(cal, kind)


def units(seconds: float, cal: Mapping[str, Any], kind: str = "numpy") -> str:
    """A duration for printing in calibration units, e.g. ``"61.2 numpy units"``."""
    return f"{relative(seconds, cal, kind):.3g} {kind} units"


def rate_units(rate_per_s: float, cal: Mapping[str, Any], kind: str = "numpy") -> str:
    """A rate for printing per calibration unit, e.g. ``"3.1e+05 per numpy unit"``."""
    return f"{rate_relative(rate_per_s, cal, kind):.3g} per {kind} unit"


def in_units(cal: Mapping[str, Any], kind: str, seconds: Mapping[str, float | None] | None = None,
             rates: Mapping[str, float | None] | None = None) -> dict[str, float | None]:
    """Figures re-expressed with the ``kind`` workload as the unit of time, for a benchmark's JSON: every duration
    of ``seconds`` through :func:`relative`, every rate (per second) of ``rates`` through :func:`rate_relative`,
    under the same keys (rounded to 4 significant digits; None stays None)."""
    out: dict[str, float | None] = {}
    for figures, f in ((seconds or {}, relative), (rates or {}, rate_relative)):
        for key, value in figures.items():
            out[key] = None if value is None else float(f"{f(value, cal, kind):.4g}")
    return out


_DURATION_WORDS = {"seconds": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def timing_of(key: str) -> tuple[str, float] | None:
    """What an output key's name says about its value: ``("rate", 1.0)`` for a rate per second (the words
    ``per_s``), ``("duration", scale)`` for a duration in seconds, ms or µs (a word ``seconds`` or ``s``, ``ms``,
    ``us``; ``scale`` converts to seconds), None for anything else. Words are the key's ``_``-separated parts, so
    ``single_reports_per_s``, ``close_seconds``, ``p99_ms``, ``verify_us_local`` and ``max_lock_hold_s`` are
    timings and ``cpus`` or ``rss_mb`` are not."""
    words = key.split("_")
    for i, w in enumerate(words):
        if w == "per" and i + 1 < len(words) and words[i + 1] == "s":
            return "rate", 1.0
    for w in words:
        if w in _DURATION_WORDS:
            return "duration", _DURATION_WORDS[w]
    return None


def timing_figures(figures: Mapping[str, Any], cal: Mapping[str, Any], kind: str) -> dict[str, float]:
    """The timing figures of a flat result (keys as :func:`timing_of` reads them, numeric values; bools, None and
    the rest left out) in ``kind`` units: durations as multiples of the unit, rates per unit (4 significant
    digits)."""
    out: dict[str, float] = {}
    for key, value in figures.items():
        t = timing_of(key)
        if t is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        ratio = rate_relative(value, cal, kind) if t[0] == "rate" else relative(value * t[1], cal, kind)
        out[key] = float(f"{ratio:.4g}")
    return out


def unit_label(key: str, ratio: float, kind: str) -> str:
    """A ratio of :func:`timing_figures` for printing: ``"61.2 python units"`` or ``"3.1e+05 per python unit"``."""
    t = timing_of(key)
    return f"{ratio:.3g} per {kind} unit" if t is not None and t[0] == "rate" else f"{ratio:.3g} {kind} units"
