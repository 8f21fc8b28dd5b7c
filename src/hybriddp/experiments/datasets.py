"""The log an experiment runs on, and its default parameters (paper Fig. 10).

``--dataset aol`` / ``yandex`` generates the calibrated synthetic log
(:func:`hybriddp.datasets.synth.generate`, seeded from ``--seed``, once per experiment run and
shared by every trial). ``--dataset PATH`` loads a real log with :func:`hybriddp.io.loaders.load_log`
(format detected: AOL TSV, items ``.dat`` such as Kosarak, CSV/TSV/Parquet with columns
``user``, ``query`` and optionally ``url``); ``--row-per-user`` makes every record its own
user (the 128-user AOL sample has too few users for any opt-in group otherwise).

Defaults: the paper's (Fig. 10). A log file gets the AOL defaults (ε = 4, 5% opt-in, M = 50)
with δ = min(1e-5, 1/n_users), so that δ stays below one over the number of users as the
paper's choices do (1e-5 for AOL's ~5·10^5 users, 1e-7 for Yandex's ~5·10^6).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from hybriddp.core.errors import DataError, parameter_error
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import RecordLog
from hybriddp.experiments.figures import Point

logger = logging.getLogger(__name__)

PRESETS = ("aol", "yandex")


@dataclass(frozen=True)
class DatasetSpec:
    """What ``--dataset`` (and ``--scale``, ``--seed``, ``--row-per-user``) asked for."""

    dataset: str
    seed: int = 0
    scale: float = 1.0
    row_per_user: bool = False

    @property
    def is_preset(self) -> bool:
        return self.dataset in PRESETS

    @property
    def kind(self) -> str:
        """``aol``, ``yandex`` or ``file`` (which grids and which paper claims apply)."""
        return self.dataset if self.is_preset else "file"

    @property
    def name(self) -> str:
        """Short name for the default output directory: the preset, or the file name without extensions."""
        if self.is_preset:
            return self.dataset
        return Path(self.dataset).name.split(".")[0] or "log"

    @property
    def data_id(self) -> str:
        """Identity of the data in ``trials.csv``: rows of other data are never mixed in."""
        if self.is_preset:
            return f"{self.dataset}(scale={self.scale:g},seed={self.seed})"
        return f"{os.path.abspath(self.dataset)}" + ("(row-per-user)" if self.row_per_user else "")

    def validate(self) -> None:
        """Refuse options that do not apply; one-line errors (exit 2 in the CLI)."""
        if self.is_preset:
            if not self.scale > 0:
                raise parameter_error("scale (--scale)", self.scale, "> 0")
            if self.row_per_user:
                raise parameter_error("--row-per-user", True, "unset for the synthetic datasets aol and yandex",
                                      "It applies to a log file given as --dataset PATH.")
            return
        if self.scale != 1.0:
            raise parameter_error("scale (--scale)", self.scale, "1 for a log file",
                                  "--scale only applies to the synthetic datasets aol and yandex.")
        p = Path(self.dataset)
        if not p.is_file():
            raise DataError(f"--dataset {self.dataset}: not 'aol', 'yandex' or an existing log file")

    def load(self) -> RecordLog:
        """Generate or load the log (once per experiment run)."""
        self.validate()
        if self.is_preset:
            from hybriddp.datasets.synth import generate

            logger.info("generating the %s preset (scale %g, seed %d)", self.dataset, self.scale, self.seed)
            return generate(self.dataset, seed=self.seed, scale=self.scale)
        return _load_file(self.dataset, self.row_per_user)

    def base_point(self, log: RecordLog) -> Point:
        """The paper defaults (Fig. 10) for this dataset; a file: AOL's with δ = min(1e-5, 1/n_users)."""
        if self.is_preset:
            return Point.of(BlenderParams.paper_defaults(self.dataset))
        aol = Point.of(BlenderParams.paper_defaults("aol"))
        return replace(aol, delta=min(aol.delta, 1.0 / max(log.n_users, 1)))


def _load_file(path: str, row_per_user: bool) -> RecordLog:
    from hybriddp.io.loaders import detect_format, load_log

    fmt = detect_format(path)
    if fmt in ("csv", "tsv", "parquet"):
        url_col = "url" if "url" in _table_columns(path, fmt) else None
        log = load_log(path, format=fmt, user_col=None if row_per_user else "user", query_col="query",
                       url_col=url_col, row_per_user=row_per_user)
    else:
        log = load_log(path, format=fmt)
        if row_per_user:
            log = log.one_user_per_record()
    if log.n_users == 0:
        raise DataError(f"--dataset {path}: the log has no records")
    logger.info("loaded %s: %d users, %d records", path, log.n_users, log.n_records)
    return log


def _table_columns(path: str, fmt: str) -> list[str]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    from hybriddp.io.loaders import header_names

    return header_names(path, "," if fmt == "csv" else "\t", fmt == "csv")
