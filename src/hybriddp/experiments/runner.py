"""Runs of an experiment: tasks, deterministic seeds, ``trials.csv`` (resume) and parallel execution.

A *task* is one run of one algorithm family at one :class:`~hybriddp.experiments.figures.Point`
for one trial. The ``blender`` family is one BLENDER run giving the paired ``blender``,
``optin-only`` and ``client-only`` results (:func:`hybriddp.simulation.algorithms.blender_family`);
``blender-reuse`` is BLENDER with ``--estimator reuse`` (and ``blender-consistent`` that run reblended) at the
point's seed; ``local-only`` and ``local-only-hashed`` are the baselines of paper Fig. 12, and ``blender-tuned``
is BLENDER with tune's knobs (:mod:`hybriddp.experiments.tuned`). Every row names its line's estimator
(column ``estimator``; :data:`~hybriddp.experiments.figures.ALGORITHM_ESTIMATORS`) and ``blender-tuned``'s rows
the knobs tune chose (``tuned_f_o``, ``tuned_f_c``). Tasks do not belong to figures: a point that
several figures use is run once.

Seeds: trial ``t`` of a point uses the algorithm seed ``blake2b(seed | t | point)`` (63 bits),
so every run is reproducible and independent of the order and the number of workers. Seeded
runs carry no privacy guarantee; they are simulations of the algorithms.

``trials.csv`` gets one row per algorithm and task, appended in one write, flushed and fsynced
as each task finishes (a crash loses at most the runs in progress; see :class:`TrialStore` for
what a kill in mid-write leaves). A re-run reads it and skips every
task whose rows are there (same data, family, point, trial and seed) *and* were made by
today's code of the family (column ``code``, :mod:`hybriddp.experiments.codeversion`); rows of
older code are run again and replaced.

Parallelism: ``jobs`` worker processes started with ``fork``, so the log (the biggest object)
is inherited copy-on-write instead of pickled; where fork is unavailable, one job. A worker
limits the library's own thread pools (batch randomizer, OLH support counts) to one thread,
so ``jobs`` processes use ``jobs`` cores.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hybriddp.core.atomic import write_bytes
from hybriddp.core.errors import DataError, HybridDPError
from hybriddp.core.records import RecordLog
from hybriddp.core.rng import hash_seed
from hybriddp.experiments.codeversion import family_fingerprint
from hybriddp.experiments.figures import ALGORITHM_ESTIMATORS, FAMILY_ALGORITHMS, FAMILY_OF, Point

logger = logging.getLogger(__name__)

METRICS = ("ndcg", "ndcg_queries", "ndcg_queries_at_10", "l1", "l1_union", "l1_queries", "hit_rate",
           "top_url_rate", "mass_outside_head_list")
"""Metrics written for every run (ALGORITHM.md §9; :func:`hybriddp.simulation.evaluate.score`)."""

FIG9_COLUMNS = ("p_blended", "p_optin_sum", "p_client_direct", "p_client_sum")
"""The estimate columns of the paper's Fig. 9 (blended, opt-in Σ_u, client direct, client Σ_u)."""
FIG9_ALGORITHMS = ("blender", "blender-reuse")
"""The lines whose rows count the regressions of their Fig. 9 table (the table itself is kept for ``blender``)."""

KEY_COLUMNS = ("data", "algorithm", "epsilon", "delta", "optin_fraction", "f_c", "head_list_size", "trial", "seed")
COLUMNS = (*KEY_COLUMNS, "family", "estimator", *METRICS, "head_list_records", "head_list_queries",
           *(f"regressions_{c.removeprefix('p_')}" for c in FIG9_COLUMNS), "tuned_f_o", "tuned_f_c", "seconds",
           "error", "code")
TRIALS_FILE = "trials.csv"
TABLES_FILE = "fig9_tables.jsonl"


@dataclass(frozen=True, order=True)
class Task:
    """One run: an algorithm family at a point, trial ``trial``, seeded with ``seed``."""

    family: str
    point: Point
    trial: int
    seed: int

    def row_key(self, data_id: str, algorithm: str) -> tuple[str, ...]:
        p = self.point
        return _key(data_id, algorithm, p.epsilon, p.delta, p.optin_fraction, p.f_c, p.head_list_size,
                    self.trial, self.seed)


def _key(data_id: str, algorithm: str, epsilon: Any, delta: Any, optin: Any, f_c: Any, m: Any, trial: Any,
         seed: Any) -> tuple[str, ...]:
    """Canonical text key of a row (floats compared at 10 significant digits)."""
    return (data_id, algorithm, *(f"{float(v):.10g}" for v in (epsilon, delta, optin, f_c)), str(int(m)),
            str(int(trial)), str(int(seed)))


def row_key(row: dict[str, Any]) -> tuple[str, ...]:
    """The key of a ``trials.csv`` row (as read back or as written)."""
    return _key(*(row[c] for c in KEY_COLUMNS))


def trial_seed(seed: int, trial: int, point: Point) -> int:
    """The algorithm seed of trial ``trial`` at ``point``: a 63-bit hash of (seed, trial, point)."""
    return hash_seed(seed, trial, point.key())


def make_tasks(families_points: Iterable[tuple[str, Point]], trials: int, seed: int) -> list[Task]:
    """Every (family, point) × trial, deduplicated, in a stable order."""
    unique = sorted(set(families_points))
    return [Task(fam, pt, t, trial_seed(seed, t, pt)) for fam, pt in unique for t in range(trials)]


# --------------------------------------------------------------------------------------
# trials.csv
# --------------------------------------------------------------------------------------


class TrialStore:
    """``trials.csv`` (+ the Fig. 9 tables in ``fig9_tables.jsonl``) in an output directory.

    Both files are resume logs that grow by one finished run at a time. A run's lines are
    appended in one write, flushed and fsynced (the table line before the CSV rows); a file is
    created with its header, compacted or repaired only by an atomic rewrite
    (:mod:`hybriddp.core.atomic`). So a process killed at any moment leaves both files readable:
    at worst the last line is cut off. The reader ignores such a torn line (it is the run in
    progress at the kill; it is run again), logs a warning naming the file, counts it in
    :attr:`torn`, and rewrites the file atomically before anything is appended after it.
    """

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / TRIALS_FILE
        self.tables_path = out_dir / TABLES_FILE
        self.rows: dict[tuple[str, ...], dict[str, Any]] = {}
        self.tables: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        self.torn: list[Path] = []
        """The files whose torn last line was dropped when they were read."""
        self._read()

    def _read(self) -> None:
        text = self._complete_lines(self.path)
        if text is not None:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            header = tuple(reader.fieldnames or ())
            damaged = self.path in self.torn
            for raw in reader:
                try:
                    if None in raw or None in raw.values():  # too many / too few fields
                        raise ValueError("wrong number of fields")
                    key = row_key(raw)
                    damaged |= key in self.rows  # a run redone for new code: keep the later row, compact
                    self.rows[key] = _parse(raw)
                except (KeyError, TypeError, ValueError):
                    damaged = True
                    logger.warning("%s: skipping an unreadable row (it will be run again)", self.path)
            if damaged or header != COLUMNS:  # a torn last line or an older layout: rewrite with today's columns
                self._rewrite()
        text = self._complete_lines(self.tables_path)
        if text is not None:
            damaged = self.tables_path in self.torn
            for line in text.splitlines():
                try:
                    obj = json.loads(line)
                    self.tables[tuple(obj["key"])] = obj["figure9"]
                except (ValueError, KeyError, TypeError):
                    damaged = True
                    logger.warning("%s: skipping an unreadable line", self.tables_path)
            if damaged:
                self._rewrite_tables()

    def _complete_lines(self, path: Path) -> str | None:
        """The text of ``path`` up to its last line break (None if absent); a cut-off last line is dropped."""
        if not path.exists():
            return None
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            data = data[:data.rfind(b"\n") + 1]
            self.torn.append(path)
            logger.warning("%s: the last line was cut off by an interrupted write; ignoring it (that run will be "
                           "done again)", path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path} is not a UTF-8 file written by `hybriddp experiment` (byte {exc.start}); "
                            "move it away to start this output directory over") from None

    def _rewrite(self) -> None:
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in self.rows.values():
            w.writerow(_format(row))
        write_bytes(self.path, buf.getvalue().encode("utf-8"))

    def _rewrite_tables(self) -> None:
        text = "".join(json.dumps({"key": list(k), "figure9": t}) + "\n" for k, t in self.tables.items())
        write_bytes(self.tables_path, text.encode("utf-8"))

    def done(self, task: Task, data_id: str) -> bool:
        """Whether every algorithm row of ``task`` is stored, made by today's code of its family."""
        code = family_fingerprint(task.family)
        return all((r := self.rows.get(task.row_key(data_id, a))) is not None and r.get("code") == code
                   for a in FAMILY_ALGORITHMS[task.family])

    def stale(self, task: Task, data_id: str) -> bool:
        """Whether ``task`` has stored rows that older code made (they are run again)."""
        return not self.done(task, data_id) and any(task.row_key(data_id, a) in self.rows
                                                    for a in FAMILY_ALGORITHMS[task.family])

    def append(self, rows: list[dict[str, Any]], table: list[dict[str, Any]] | None) -> None:
        """Store one task's rows: the Fig. 9 table line first, then the CSV rows, each in one fsynced write."""
        if table is not None:
            key = row_key(rows[0])
            self.tables[key] = table
            _append(self.tables_path, (json.dumps({"key": list(key), "figure9": table}) + "\n").encode("utf-8"))
        new = not self.path.exists()
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, COLUMNS, extrasaction="ignore")
        if new:
            w.writeheader()
        for row in rows:
            w.writerow(_format(row))
        if new:  # created whole, header included: the header is never torn
            write_bytes(self.path, buf.getvalue().encode("utf-8"))
        else:
            _append(self.path, buf.getvalue().encode("utf-8"))
        for row in rows:
            self.rows[row_key(row)] = row

    def get(self, task: Task, data_id: str, algorithm: str) -> dict[str, Any] | None:
        return self.rows.get(task.row_key(data_id, algorithm))


@dataclass(frozen=True)
class RunSet:
    """The runs of one experiment invocation: which data, how many trials, which seed."""

    store: TrialStore
    data_id: str
    trials: int
    seed: int

    def task(self, family: str, point: Point, trial: int) -> Task:
        return Task(family, point, trial, trial_seed(self.seed, trial, point))

    def rows(self, algorithm: str, point: Point) -> list[dict[str, Any]]:
        """Stored rows of ``algorithm`` at ``point`` for trials ``0..trials-1`` (those present)."""
        family = FAMILY_OF[algorithm]
        found = (self.store.get(self.task(family, point, t), self.data_id, algorithm) for t in range(self.trials))
        return [r for r in found if r is not None]

    def table(self, point: Point, trial: int) -> list[dict[str, Any]] | None:
        """The stored Fig. 9 table of BLENDER's trial ``trial`` at ``point``."""
        return self.store.tables.get(self.task("blender", point, trial).row_key(self.data_id, "blender"))


def _append(path: Path, data: bytes) -> None:
    """Append whole lines in one write, flushed and fsynced (a kill can only cut the last line)."""
    with path.open("ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


_INT_COLUMNS = {"head_list_size", "trial", "seed", "head_list_records", "head_list_queries",
                *(f"regressions_{c.removeprefix('p_')}" for c in FIG9_COLUMNS)}
_FLOAT_COLUMNS = {"epsilon", "delta", "optin_fraction", "f_c", "seconds", "tuned_f_o", "tuned_f_c", *METRICS}


def _parse(raw: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for k, v in raw.items():
        if k is None:
            continue
        if v in (None, ""):
            row[k] = None
        elif k in _INT_COLUMNS:
            row[k] = int(v)  # exact: seeds have 63 bits, more than a float holds
        elif k in _FLOAT_COLUMNS:
            row[k] = float(v)
        else:
            row[k] = v
    row_key(row)  # raises on an incomplete key
    if row.get("estimator") is None and row["algorithm"] != "blender-tuned":  # a row from before the column
        row["estimator"] = ALGORITHM_ESTIMATORS.get(row["algorithm"])
    return row


def _format(row: dict[str, Any]) -> dict[str, Any]:
    return {k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in row.items()}


# --------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------

_LOG: RecordLog | None = None  # set in the parent before the workers fork; inherited copy-on-write


def run_task(task: Task, data_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Run one task on the module's log; returns its ``trials.csv`` rows and (BLENDER) its Fig. 9 table.

    A run that cannot complete for a reason the user can cause (e.g. the opt-in group's head list
    is empty at a small opt-in fraction; :class:`~hybriddp.core.errors.HybridDPError`) gives rows with
    the error and ``head_list_records = 0``: the point is then missing from the figure.
    """
    from hybriddp.simulation.algorithms import blender_family, reblended, run_algorithm
    from hybriddp.simulation.pipeline import run_blender

    if _LOG is None:
        raise RuntimeError("run_task: no log loaded (set_log first)")
    start = time.perf_counter()
    base = {"data": data_id, "family": task.family, "trial": task.trial, "seed": task.seed,
            "code": family_fingerprint(task.family),
            **{k: getattr(task.point, k) for k in ("epsilon", "delta", "optin_fraction", "f_c", "head_list_size")}}
    algorithms = FAMILY_ALGORITHMS[task.family]
    extra: dict[str, Any] = {}
    try:
        params = task.point.params()
        if task.family == "blender":  # the paper's BLENDER as published: no check against fake reports (§7.2),
            results = blender_family(_LOG, params, seed=task.seed, defense=None)  # which the default's line has
        elif task.family == "blender-tuned":
            from hybriddp.experiments.tuned import tuned_params

            tuned, info = tuned_params(_LOG, task.point, task.seed)
            extra = {"tuned_f_o": info["tuned_f_o"], "tuned_f_c": info["tuned_f_c"], "estimator": tuned.estimator}
            results = {"blender-tuned": run_blender(_LOG, tuned, seed=task.seed).result()}
        elif task.family == "blender-reuse":  # the same seed as the point's blender run: paired
            run = run_blender(_LOG, replace(params, estimator=ALGORITHM_ESTIMATORS["blender-reuse"]), seed=task.seed)
            results = {"blender-reuse": run.result(), "blender-consistent": reblended(run, "consistent").result()}
        else:
            results = {task.family: run_algorithm(task.family, _LOG, params, seed=task.seed)}
    except HybridDPError as exc:
        seconds = time.perf_counter() - start
        logger.info("run %s %s trial %d failed: %s", task.family, task.point.key(), task.trial, exc)
        return [{**base, "estimator": ALGORITHM_ESTIMATORS.get(a), **extra, "algorithm": a, "head_list_records": 0,
                 "head_list_queries": 0, "seconds": seconds, "error": str(exc).replace("\n", " ")}
                for a in algorithms], None
    seconds = time.perf_counter() - start
    rows = []
    table = None
    for a in algorithms:
        res = results[a]
        row = {**base, "estimator": ALGORITHM_ESTIMATORS.get(a), **extra, "algorithm": a,
               "head_list_records": int(res.n_records),
               "head_list_queries": int(res.head_list.n_queries), "seconds": seconds, "error": None}
        row.update({m: _num(res.metrics.get(m)) for m in METRICS})
        if a in FIG9_ALGORITHMS and res.parts is not None and res.truth_query is not None:
            fig9 = res.figure9()
            for c in FIG9_COLUMNS:
                row[f"regressions_{c.removeprefix('p_')}"] = sum(bool(r[c + "_regression"]) for r in fig9)
            table = fig9 if a == "blender" else table
        rows.append(row)
    return rows, table


def _num(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return f if f == f else None  # NaN -> empty


def _init_worker() -> None:
    """One thread per worker process, so ``jobs`` processes use ``jobs`` cores: the library's own
    pools (:func:`hybriddp.core.threads.default_threads`) and BLAS (these variables)."""
    from hybriddp.core.threads import set_default_threads

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    set_default_threads(1)


# --------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------


def fork_available() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def execute(log: RecordLog, tasks: list[Task], store: TrialStore, data_id: str, *, jobs: int,
            on_done: Callable[[Task], None] | None = None) -> int:
    """Run the tasks not yet in ``store``; returns how many ran. Rows are stored as each task ends."""
    global _LOG
    todo = [t for t in tasks if not store.done(t, data_id)]
    logger.info("%d runs to do, %d already in %s", len(todo), len(tasks) - len(todo), store.path)
    if n_stale := sum(store.stale(t, data_id) for t in todo):
        logger.warning("%d stored runs in %s were made by different algorithm code: running them again",
                       n_stale, store.path)
    if not todo:
        return 0
    _LOG = log
    jobs = max(1, min(jobs, len(todo)))
    if jobs > 1 and not fork_available():
        logger.warning("the fork start method is unavailable here: running with one job")
        jobs = 1
    try:
        if jobs == 1:
            for task in todo:
                store.append(*run_task(task, data_id))
                if on_done:
                    on_done(task)
            return len(todo)
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker) as pool:
            pending = {pool.submit(run_task, task, data_id): task for task in todo}
            try:
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        task = pending.pop(fut)
                        store.append(*fut.result())
                        if on_done:
                            on_done(task)
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise
        return len(todo)
    finally:
        _LOG = None
