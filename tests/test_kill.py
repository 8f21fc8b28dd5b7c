"""Kill tests: SIGKILL the real CLI mid-work; no output is ever lost or half-written.

Every command runs as ``python -m hybriddp`` in a process group of its own and is killed
(SIGKILL, the whole group) at several moments: as soon as a new temporary output file holds
data (io.atomic writes ``.<name>.<random>.tmp`` next to the output, so the kill lands while an
output is being written), and at calibrated fractions of a complete run's wall time. A kill can
land after the command has finished — a complete output is always an allowed outcome, so no
timing is asserted. After each kill every output must be either

* absent (it did not exist before),
* byte-for-byte the earlier file (pre-created before the run), or
* complete and valid: equal to (or, for outputs with time stamps, parsing like) the output of
  an uninterrupted run with the same seed.

``trials.csv`` is a resume log (docs/DECISIONS.md): after a kill its complete lines are all
readable rows, nothing stored before is lost, and a re-run resumes and finishes.

``randomize`` and ``headlist`` write through ``hybriddp.io.exchange``; their tests check the same
contract for those commands.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybriddp.experiments.runner import COLUMNS, row_key
from logdata import write_aol, zipf_log

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups needed")

TMP = re.compile(r"^\..+\.tmp$")  # io.atomic's temporary names
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_END = b"IEND\xaeB`\x82"


# --------------------------------------------------------------------------------------
# Running and killing
# --------------------------------------------------------------------------------------


def _command(args: Sequence[object]) -> list[str]:
    return [sys.executable, "-m", "hybriddp", *(str(a) for a in args)]


def run_ok(args: Sequence[object], cwd: Path) -> tuple[float, str]:
    """Run ``hybriddp ARGS`` to completion; its wall time and standard output."""
    t0 = time.monotonic()
    proc = subprocess.run(_command(args), cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return time.monotonic() - t0, proc.stdout


def _temporaries(directory: Path) -> dict[str, int]:
    """io.atomic's temporary files in ``directory`` and their sizes (one renamed meanwhile is left out)."""
    found = {}
    with os.scandir(directory) as it:
        for e in it:
            if TMP.match(e.name):
                try:
                    found[e.name] = e.stat().st_size
                except FileNotFoundError:  # renamed to its final name between listing and stat
                    pass
    return found


def run_and_kill(args: Sequence[object], cwd: Path, *, delay: float | None = None, watch: Path | None = None,
                 nonempty: bool = False, timeout: float = 30.0) -> None:
    """Start ``hybriddp ARGS`` and SIGKILL its process group.

    The kill comes ``delay`` seconds after the start, or (``watch``) as soon as a temporary file
    that was not there before appears in ``watch`` (``nonempty``: once it holds data), whichever
    comes first; a command that finishes first is simply left finished.
    """
    before = set(_temporaries(watch)) if watch is not None else set()
    proc = subprocess.Popen(_command(args), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    t0 = time.monotonic()
    try:
        while proc.poll() is None:
            elapsed = time.monotonic() - t0
            if elapsed > timeout or (delay is not None and elapsed >= delay):
                break
            if watch is not None and any(name not in before and (size > 0 or not nonempty)
                                         for name, size in _temporaries(watch).items()):
                break
            time.sleep(0.001)
        if proc.poll() is None:  # still running (a zombie keeps its group until reaped below)
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)


def kill_plans(wall: float, watch: Path) -> list[dict[str, object]]:
    """Kill moments: mid-write (a new temporary file holding data), and 70% and 95% of a full run's time."""
    return [{"watch": watch, "nonempty": True}, {"delay": 0.7 * wall}, {"delay": 0.95 * wall}]


def assert_kept_or_complete(path: Path, earlier: bytes | None, complete: Callable[[bytes], bool]) -> None:
    """``path`` is absent (when it was), the earlier bytes, or complete by ``complete``."""
    if not path.exists():
        assert earlier is None, f"{path} was deleted"
        return
    data = path.read_bytes()
    if data == earlier:
        return
    try:
        whole = complete(data)
    except (ValueError, EOFError, OSError, KeyError, zlib.error) as exc:  # torn JSON, gzip, UTF-8
        whole, why = False, f": {exc!r}"
    else:
        why = ""
    assert whole, f"{path} is neither the earlier file nor complete ({len(data)} bytes){why}"


# --------------------------------------------------------------------------------------
# synth
# --------------------------------------------------------------------------------------


def _records_written(stdout: str) -> int:
    match = re.search(r"([\d,]+) records", stdout)
    assert match, stdout
    return int(match.group(1).replace(",", ""))


@pytest.mark.parametrize("name", ["log.tsv.gz", "log.parquet"])
def test_synth_killed_keeps_the_earlier_file_or_writes_it_whole(tmp_path: Path, name: str) -> None:
    args = ("synth", "--preset", "aol", "--scale", "0.005", "--seed", "5", "-o")
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    wall, stdout = run_ok((*args, ref_dir / name), tmp_path)
    reference = (ref_dir / name).read_bytes()
    n_records = _records_written(stdout)
    if name.endswith(".gz"):  # the reference itself is complete: the whole stream decompresses, every record
        lines = gzip.decompress(reference).decode("utf-8").split("\n")
        assert lines[0].startswith("AnonID\t") and lines[-1] == ""
        assert sum(line.split("\t")[4] != "" for line in lines[1:-1]) == n_records
    else:
        assert pq.read_table(ref_dir / name).num_rows == n_records
    earlier = b"an earlier file that must survive a killed synth\n"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / name
    for i, plan in enumerate(kill_plans(wall, out_dir)):
        before = earlier if i % 2 == 0 else None  # an existing output, then none
        if before is None:
            out.unlink(missing_ok=True)
        else:
            out.write_bytes(before)
        run_and_kill((*args, out), tmp_path, **plan)  # type: ignore[arg-type]
        assert_kept_or_complete(out, before, lambda data: data == reference)


# --------------------------------------------------------------------------------------
# experiment
# --------------------------------------------------------------------------------------

FIGURE_FILES = ("fig15.csv", "fig16.csv", "fig15.png", "fig16.png", "summary.json", "report.md")


def _complete_lines(data: bytes) -> bytes:
    return data[:data.rfind(b"\n") + 1]


def _trial_keys(path: Path) -> list[tuple[str, ...]]:
    """The run keys of trials.csv's complete lines, each checked to be a whole row of today's columns.

    (A key can repeat: a run redone because the algorithm code changed is replaced at the next read.)
    """
    data = _complete_lines(path.read_bytes())
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))
    assert rows and tuple(rows[0]) == COLUMNS
    assert all(None not in r and None not in r.values() for r in rows)
    return [row_key(r) for r in rows]


def _report_shape(text: str) -> list[tuple[str, int]]:
    """Each figure section of report.md with the number of its table lines."""
    shape: list[tuple[str, int]] = []
    for line in text.splitlines():
        if line.startswith("## fig"):
            shape.append((line, 0))
        elif line.startswith("|") and shape:
            shape[-1] = (shape[-1][0], shape[-1][1] + 1)
    return shape


def _complete_output(name: str, earlier: bytes, trials: int) -> Callable[[bytes], bool]:
    """Whether ``data`` is a whole ``name`` of an experiment with ``trials`` trials (same figures as ``earlier``)."""
    def complete(data: bytes) -> bool:
        if name.endswith(".png"):
            return _whole_png(data)
        text = data.decode("utf-8")
        if name.endswith(".csv"):
            rows = list(csv.reader(io.StringIO(text, newline="")))
            old = list(csv.reader(io.StringIO(earlier.decode("utf-8"), newline="")))
            return rows[0] == old[0] and len(rows) == len(old) and all(len(r) == len(old[0]) for r in rows)
        if name == "summary.json":
            summary = json.loads(text)
            return summary["trials"] == trials and summary["figures"].keys() == json.loads(earlier)["figures"].keys()
        return (f"{trials} trials per point" in text and text.endswith("\n")
                and _report_shape(text) == _report_shape(earlier.decode("utf-8")))
    return complete


def test_experiment_killed_then_resumed(tmp_path: Path) -> None:
    """A finished 1-trial experiment is extended to 2 trials and killed again and again; every
    figure file stays the 1-trial one or becomes a whole 2-trial one, no stored run is lost, and
    a last run resumes and completes."""
    out = tmp_path / "exp"
    base = ("experiment", "fig15", "--dataset", "aol", "--scale", "0.02", "--quick", "--jobs", "1", "--seed", "3",
            "--out", out, "--trials")
    wall, _ = run_ok((*base, 1), tmp_path)
    earlier = {f: (out / f).read_bytes() for f in FIGURE_FILES}
    assert _complete_output("summary.json", earlier["summary.json"], 1)(earlier["summary.json"])
    first = set(_trial_keys(out / "trials.csv"))
    assert first
    for plan in ({"watch": out}, {"delay": 0.6 * wall}, {"delay": 0.85 * wall}):
        run_and_kill((*base, 2), tmp_path, **plan)  # type: ignore[arg-type]
        assert first <= set(_trial_keys(out / "trials.csv"))  # nothing stored before is lost
        for f in FIGURE_FILES:
            assert_kept_or_complete(out / f, earlier[f], _complete_output(f, earlier[f], 2))
    _, stdout = run_ok((*base, 2), tmp_path)
    assert re.search(r"(\d+) runs \(\d+ new", stdout), stdout
    keys = _trial_keys(out / "trials.csv")
    assert first < set(keys) and len(set(keys)) == 2 * len(first)  # trials 0 and 1 of every run
    assert {k[-2] for k in keys} == {"0", "1"}
    for f in FIGURE_FILES:
        data = (out / f).read_bytes()
        assert _complete_output(f, earlier[f], 2)(data), f


def _whole_png(data: bytes) -> bool:
    return data.startswith(PNG_SIGNATURE) and data.endswith(PNG_END)


def test_mean_plot_killed_keeps_or_completes_each_png(tmp_path: Path) -> None:
    args = ("mean", "plot", "--epsilon", 1, "--optin-fraction", 0.05, "--out", tmp_path / "plots")
    wall, _ = run_ok(args, tmp_path)
    names = ("mean-mse-vs-n.png", "mean-improvement-vs-n.png")
    earlier = b"an earlier image"
    for i, plan in enumerate(kill_plans(wall, tmp_path / "plots")[:2]):
        for name in names:
            if i == 0:
                (tmp_path / "plots" / name).write_bytes(earlier)
            else:
                (tmp_path / "plots" / name).unlink()
        run_and_kill(args, tmp_path, **plan)  # type: ignore[arg-type]
        for name in names:
            assert_kept_or_complete(tmp_path / "plots" / name, earlier if i == 0 else None, _whole_png)


# --------------------------------------------------------------------------------------
# headlist and randomize (writers in hybriddp.io.exchange)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def curator_setup(tmp_path_factory) -> tuple[Path, float, dict[str, bytes]]:
    """A log on disk and a reference ``headlist`` run: its wall time and its two files."""
    d = tmp_path_factory.mktemp("curator")
    write_aol(zipf_log(n_users=5_000, seed=1), d / "log.tsv")
    wall, _ = run_ok(_headlist_args(d, d / "headlist.json", d / "estimates.json"), d)
    return d, wall, {"headlist": (d / "headlist.json").read_bytes(), "estimates": (d / "estimates.json").read_bytes()}


def _headlist_args(d: Path, hl: Path, est: Path) -> tuple[object, ...]:
    return ("headlist", "--input", d / "log.tsv", "--seed", 7, "--out-headlist", hl, "--out-estimates", est)


def _same_json(reference: bytes) -> Callable[[bytes], bool]:
    return lambda data: json.loads(data) == json.loads(reference)


def test_headlist_killed_keeps_or_completes_each_file(curator_setup, tmp_path: Path) -> None:
    d, wall, reference = curator_setup
    hl, est = tmp_path / "headlist.json", tmp_path / "estimates.json"
    earlier = {"headlist": b'{"an": "earlier head list"}\n', "estimates": b'{"earlier": "estimates"}\n'}
    for i, plan in enumerate(kill_plans(wall, tmp_path)):
        exists = i % 2 == 0
        for path, key in ((hl, "headlist"), (est, "estimates")):
            if exists:
                path.write_bytes(earlier[key])
            else:
                path.unlink(missing_ok=True)
        run_and_kill(_headlist_args(d, hl, est), tmp_path, **plan)  # type: ignore[arg-type]
        for path, key in ((hl, "headlist"), (est, "estimates")):
            assert_kept_or_complete(path, earlier[key] if exists else None, _same_json(reference[key]))


def test_randomize_killed_keeps_or_completes_the_reports(curator_setup, tmp_path: Path) -> None:
    d, _, _ = curator_setup
    args = ("randomize", "--headlist", d / "headlist.json", "--input", d / "log.tsv", "--seed", 8, "-o")
    wall, _ = run_ok((*args, d / "reports.jsonl.gz"), d)
    reference = gzip.decompress((d / "reports.jsonl.gz").read_bytes())
    assert reference.endswith(b"\n") and all(json.loads(line) for line in reference.splitlines())
    out = tmp_path / "reports.jsonl.gz"
    earlier = gzip.compress(b'{"earlier": "reports"}\n')
    for i, plan in enumerate(kill_plans(wall, tmp_path)):
        before = earlier if i % 2 == 0 else None
        if before is None:
            out.unlink(missing_ok=True)
        else:
            out.write_bytes(before)
        run_and_kill((*args, out), tmp_path, **plan)  # type: ignore[arg-type]
        assert_kept_or_complete(out, before, lambda data: gzip.decompress(data) == reference)
