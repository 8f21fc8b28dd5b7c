"""Options shared by several commands, with units and defaults in their help."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from hybriddp.io.loaders import load_log
from hybriddp.params import BlenderParams
from hybriddp.records import RecordLog

FORMATS = ["aol", "csv", "tsv", "parquet", "items"]

F = Callable[..., Any]


def _stack(*decorators: F) -> F:
    def wrap(f: F) -> F:
        for d in reversed(decorators):
            f = d(f)
        return f
    return wrap


def input_options(required: bool = True) -> F:
    """--input and the loader options (ALGORITHM.md §1 records; loaders in hybriddp.io.loaders)."""
    return _stack(
        click.option("--input", "input_path", type=click.Path(dir_okay=False), required=required,
                     help="Search log to read: AOL TSV (.gz ok), CSV/TSV, Parquet, or an items file "
                          "(.dat: one user per line)."),
        click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
                     help="Input format. Default: detected from the extension and the header."),
        click.option("--user-col", default=None, help="CSV/TSV/Parquet: column with the user id."),
        click.option("--query-col", default="query", show_default=True, help="CSV/TSV/Parquet: query column."),
        click.option("--url-col", default=None,
                     help="CSV/TSV/Parquet: clicked-URL column. Without it the log has no URL level."),
        click.option("--row-per-user", is_flag=True,
                     help="CSV/TSV/Parquet/AOL: every row is its own user (e.g. a small sample).",),
        click.option("--skip-bad-rows", is_flag=True,
                     help="Skip malformed rows and report how many, instead of stopping at the first."),
    )


def load_input(input_path: str, fmt: str | None, user_col: str | None, query_col: str, url_col: str | None,
               row_per_user: bool, skip_bad_rows: bool, progress: Any = None) -> RecordLog:
    """Load the --input log with the loader options."""
    opts: dict[str, Any] = {"skip_bad_rows": skip_bad_rows, "progress": progress}
    kind = fmt
    if kind is None:
        from hybriddp.io.loaders import detect_format
        kind = detect_format(input_path)
    if kind in ("csv", "tsv", "parquet"):
        opts.update(user_col=user_col, query_col=query_col, url_col=url_col, row_per_user=row_per_user)
    log = load_log(input_path, format=kind, **opts)
    if row_per_user and kind not in ("csv", "tsv", "parquet"):
        log = log.one_user_per_record()
    return log


def privacy_options(with_optin: bool = True, with_curator: bool = True) -> F:
    """ε, δ and the BLENDER knobs (paper Fig. 10 defaults)."""
    opts = [
        click.option("--epsilon", type=float, default=4.0, show_default=True,
                     help="Privacy loss ε per user (opt-in and client alike); must be > ln 2."),
        click.option("--delta", type=float, default=1e-5, show_default=True,
                     help="Privacy failure probability δ, in (0, 1); keep it below 1/number-of-users."),
    ]
    if with_optin:
        opts.append(click.option("--optin-fraction", type=float, default=0.05, show_default=True,
                                 help="Share of users in the opt-in group, in (0, 1) (0.05 = 5%)."))
    if with_curator:
        opts += [
            click.option("--f-o", "f_o", type=float, default=0.95, show_default=True,
                         help="Share of opt-in users that build the head list (S); the rest (T) estimate."),
            click.option("--head-list-size", "-M", "head_list_size", type=int, default=50, show_default=True,
                         help="M: number of (query, URL) records kept in the final head list."),
            click.option("--m-o", "m_o", type=int, default=1, show_default=True,
                         help="Records sampled per opt-in user (without replacement)."),
        ]
    opts += [
        click.option("--f-c", "f_c", type=float, default=0.85, show_default=True,
                     help="Share of a client's budget spent on the query; the rest on the URL."),
        click.option("--m-c", "m_c", type=int, default=1, show_default=True,
                     help="Records each client reports (without replacement)."),
    ]
    return _stack(*opts)


def noise_option() -> F:
    """--noise discrete|laplace (curator noise on counts)."""
    return click.option("--noise", type=click.Choice(["discrete", "laplace"]), default="discrete", show_default=True,
                        help="Curator noise on counts: exact discrete Laplace from integer randomness, or the "
                             "paper's floating-point Laplace (paper-faithful experiments only).")


def seed_option() -> F:
    return click.option("--seed", type=int, default=None,
                        help="Seed for reproducible experiments. Seeded output carries NO privacy; "
                             "default: OS randomness.")


def make_params(epsilon: float, delta: float, optin_fraction: float = 0.05, f_o: float = 0.95,
                f_c: float = 0.85, head_list_size: int = 50, m_o: int = 1, m_c: int = 1,
                project: bool = True) -> BlenderParams:
    """Validated parameters (errors name the option)."""
    return BlenderParams(epsilon=epsilon, delta=delta, optin_fraction=optin_fraction, f_o=f_o, f_c=f_c,
                         head_list_size=head_list_size, m_o=m_o, m_c=m_c, project=project)
