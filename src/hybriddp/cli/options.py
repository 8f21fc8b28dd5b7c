"""Options shared by several commands, with units and defaults in their help."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click

from hybriddp.core.errors import parameter_error
from hybriddp.core.estimators import DEFAULT_ESTIMATOR, ESTIMATORS, describe_estimators
from hybriddp.core.params import (
    LN_MAX,
    MAX_RECORDS_PER_USER,
    MAX_SEED,
    MIN_DELTA,
    BlenderParams,
    check_seed,
)
from hybriddp.core.records import RecordLog
from hybriddp.io.loaders import load_log

FORMATS = ["aol", "csv", "tsv", "parquet", "items"]

DEFAULT_USER_COL = "user"
DEFAULT_URL_COL = "url"
"""Column names used when --user-col / --url-col are not given and the file has them (as `synth` writes)."""

MAX_SCALE = 10.0
"""Largest --scale of the synthetic presets: 5.2 million AOL-like or 50 million Yandex-like users."""

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
        click.option("--input", "input_path", type=click.Path(), required=required,
                     help="Search log to read: AOL TSV (.gz ok), CSV/TSV, Parquet (a file, or a directory of "
                          "Parquet files: a partitioned log), or an items file (.dat: one user per line)."),
        click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
                     help="Input format. Default: detected from the extension and the header."),
        click.option("--user-col", default=None,
                     help=f"CSV/TSV/Parquet: column with the user id. Default: {DEFAULT_USER_COL!r} if the file "
                          "has it (as `hybriddp synth` writes)."),
        click.option("--query-col", default="query", show_default=True, help="CSV/TSV/Parquet: query column."),
        click.option("--url-col", default=None,
                     help=f"CSV/TSV/Parquet: clicked-URL column. Default: {DEFAULT_URL_COL!r} if the file has it; "
                          "--url-col '' or a file without it: the log has no URL level."),
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
        user_col, url_col = default_columns(input_path, kind, user_col, url_col, row_per_user)
        opts.update(user_col=user_col, query_col=query_col, url_col=url_col, row_per_user=row_per_user)
    log = load_log(input_path, format=kind, **opts)
    if row_per_user and kind not in ("csv", "tsv", "parquet"):
        log = log.one_user_per_record()
    return log


def _column_names(path: str, kind: str) -> list[str]:
    """The header of a CSV/TSV/Parquet file. A text file that cannot be read (binary, not UTF-8) is refused
    here, before any option is checked against it; an unreadable Parquet file gives [] (the loader says why)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hybriddp.io.loaders import header_names

    if kind != "parquet":
        return header_names(path, "," if kind == "csv" else "\t", quoted=kind == "csv")
    from hybriddp.io.loaders import parquet_parts

    try:
        return list(pq.read_schema(parquet_parts(path)[0]).names)
    except (OSError, ValueError, pa.ArrowException):
        return []


def default_columns(path: str, kind: str, user_col: str | None, url_col: str | None,
                    row_per_user: bool) -> tuple[str | None, str | None]:
    """--user-col / --url-col with their defaults: the columns named ``user`` / ``url`` when the file has them.

    ``hybriddp synth`` writes Parquet with exactly these names, so ``run`` reads it with no flags.
    ``--url-col ''`` means "no URL level" even when a ``url`` column exists.
    """
    no_url = url_col == ""
    need_user = user_col is None and not row_per_user
    need_url = url_col is None
    if need_user or need_url:
        names = _column_names(path, kind)
        if need_user and DEFAULT_USER_COL in names:
            user_col = DEFAULT_USER_COL
        if need_url and DEFAULT_URL_COL in names:
            url_col = DEFAULT_URL_COL
    return user_col, (None if no_url else url_col)


def privacy_options(with_optin: bool = True, with_curator: bool = True) -> F:
    """ε, δ and the BLENDER knobs (paper Fig. 10 defaults)."""
    opts = [
        click.option("--epsilon", type=float, default=4.0, show_default=True,
                     help="Privacy loss ε per user (opt-in and client alike); must be > ln 2 and at most "
                          f"min({2 * LN_MAX:.2f}, {LN_MAX:.2f}·m_C/max(f_C, 1 − f_C)) (e^(ε/2) and e^ε' must stay "
                          "finite)."),
        click.option("--delta", type=float, default=1e-5, show_default=True,
                     help=f"Privacy failure probability δ, in [{MIN_DELTA:g}, 1); keep it below 1/number-of-users."),
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
                         help=f"Records sampled per opt-in user (without replacement), 1 to {MAX_RECORDS_PER_USER}."),
        ]
    opts += [
        click.option("--f-c", "f_c", type=float, default=0.85, show_default=True,
                     help="Share of a client's budget spent on the query, in (0, 1); the rest on the URL. "
                          "Values within 1000·2^-50·m_C/ε of 0 or 1 (2.2e-13 at ε = 4) are refused: rounding would "
                          "swamp the client estimates."),
        click.option("--m-c", "m_c", type=int, default=1, show_default=True,
                     help=f"Records each client reports (without replacement), 1 to {MAX_RECORDS_PER_USER}."),
    ]
    return _stack(*opts)


def noise_option() -> F:
    """--noise discrete|laplace (curator noise on counts)."""
    return click.option("--noise", type=click.Choice(["discrete", "laplace"]), default="discrete", show_default=True,
                        help="Curator noise on counts: exact discrete Laplace from integer randomness, or the "
                             "paper's floating-point Laplace (paper-faithful experiments only).")


SEED_HELP = "Seed for reproducible experiments. Seeded output carries NO privacy; default: OS randomness."


def _check_seed(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """Click callback: a negative or huge seed is one `error:` line, not NumPy's traceback."""
    check_seed(value)
    return value


def seed_option(help: str = SEED_HELP, default: int | None = None, show_default: bool = False) -> F:
    """--seed: None (OS randomness) or an integer in [0, 2^63 - 1]."""
    return click.option("--seed", type=int, default=default, show_default=show_default, callback=_check_seed,
                        help=f"{help} An integer from 0 to {MAX_SEED}.")


def int_range(minimum: int, maximum: int | None = None,
            why: str = "") -> Callable[[click.Context, click.Parameter, int | None], int | None]:
    """Click callback: an integer option in [``minimum``, ``maximum``] (one `error:` line otherwise)."""
    def check(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
        if value is not None and not (minimum <= value and (maximum is None or value <= maximum)):
            flag = max(param.opts, key=len)
            allowed = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum:,}"
            raise parameter_error(f"{param.name} ({flag})", value, allowed + why)
        return value
    return check


def check_scale(scale: float) -> None:
    """--scale of a synthetic preset: in (0, :data:`MAX_SCALE`]."""
    if not (0.0 < scale <= MAX_SCALE):
        raise parameter_error("scale (--scale)", scale, f"> 0 and <= {MAX_SCALE:g} (the AOL preset has 519,371 "
                              "users, the Yandex preset 4,970,073; larger logs take hours and many GB)",
                              "Use e.g. --scale 0.1 for a quick look.")


def make_params(epsilon: float, delta: float, optin_fraction: float = 0.05, f_o: float = 0.95,
                f_c: float = 0.85, head_list_size: int = 50, m_o: int = 1, m_c: int = 1,
                project: bool = True, estimator: str | None = None) -> BlenderParams:
    """Validated parameters (errors name the option); ``estimator`` None (``--estimator`` not given) is
    :data:`~hybriddp.core.estimators.DEFAULT_ESTIMATOR`."""
    return BlenderParams(epsilon=epsilon, delta=delta, optin_fraction=optin_fraction, f_o=f_o, f_c=f_c,
                         head_list_size=head_list_size, m_o=m_o, m_c=m_c, project=project,
                         estimator=estimator or DEFAULT_ESTIMATOR)


def estimator_option(f):
    """``--estimator``: which opt-in estimates, and how the blend weighs them against the clients'."""
    return click.option("--estimator", type=click.Choice(ESTIMATORS), default=None,
                        help=f"{describe_estimators()}. Default: {DEFAULT_ESTIMATOR} (estimate: the one in the "
                             "release).")(f)


def defense_options(f):
    """``--defense``, ``--anchor-alpha``, ``--anchor-kappa``, ``--anchor-honest-cost``, ``--anchor-kappa-query``,
    ``--anchor-rank-cost``: the server's check against the opt-in group (docs/ALGORITHM.md §7.2)."""
    from hybriddp.server.anchor import (
        DEFAULT_ALPHA,
        DEFAULT_HONEST_COST,
        DEFAULT_KAPPA_QUERY,
        DEFAULT_RANK_COST,
        DEFENSES,
    )

    f = click.option("--anchor-rank-cost", type=float, default=DEFAULT_RANK_COST, show_default=True,
                     help="With --anchor-kappa-query auto (the default), where the fixed guard is not kept: the "
                          "largest expected NDCG@10 the ranking guard may cost an honest round's top-10 ranking "
                          "(expected loss, all queries capped together); larger is tighter against fakes.")(f)
    kq_default = "auto" if DEFAULT_KAPPA_QUERY is None else f"{DEFAULT_KAPPA_QUERY:g}"
    f = click.option("--anchor-kappa-query", type=str, default=kq_default, show_default=True, callback=_kappa,
                     help="The suggestions' ranking guard, in standard deviations: queries are ranked by their "
                          "estimate capped this far above the opt-in group's, so that fake devices cannot lift a "
                          "query into the top 10 (the estimates themselves keep --anchor-kappa's bound; 0: no query "
                          "ranks above its opt-in estimate). auto: 0.1 where the opt-in group ranks the queries well "
                          "enough that it costs an honest ranking at most 0.005 of NDCG@10 (e.g. the aol preset's "
                          "26,000 opt-in users), elsewhere chosen per round as tight as --anchor-rank-cost allows. A "
                          "fixed 0.1 costs 0.005-0.013 of honest NDCG@10 at 1,000-10,000 opt-in users "
                          "(docs/ALGORITHM.md §7.2).")(f)
    f = click.option("--anchor-honest-cost", type=float, default=DEFAULT_HONEST_COST, show_default=True,
                     help="With --anchor-kappa auto: the largest share of an honest estimate's variance the bound "
                          "may add (0.05: its error at most 2.5% larger); smaller is looser against fakes.")(f)
    f = click.option("--anchor-kappa", type=str, default="auto", show_default=True, callback=_kappa,
                     help="The bound of --defense anchor, in standard deviations: no published estimate lies "
                          "further than this many from its opt-in estimate, whatever the device reports say. "
                          "auto: chosen per round and entry, as tight as --anchor-honest-cost allows (tight where "
                          "the opt-in group is large); a number fixes it (0: publish the opt-in estimates).")(f)
    f = click.option("--anchor-alpha", type=float, default=DEFAULT_ALPHA, show_default=True,
                     help="False-alarm rate of --defense anchor per round: an honest round has a flagged entry at "
                          "most this often (Holm's procedure over all entries and queries).")(f)
    return click.option("--defense", type=click.Choice(DEFENSES), default=DEFENSES[0], show_default=True,
                        help="anchor: test every estimate from the devices against the opt-in group's (a flag "
                             "marks the round as attacked), bound the devices' influence on every estimate and "
                             "guard the suggestions' ranking (fake devices cannot push a query up); none: the "
                             "plain blend of the paper, which 1% fake reports can steer.")(f)


def _kappa(_ctx: click.Context, _param: click.Parameter, value: str) -> float | None:
    """``--anchor-kappa``: ``auto`` (None) or a number of standard deviations >= 0."""
    if value.strip().lower() == "auto":
        return None
    try:
        kappa = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not 'auto' or a number of standard deviations (e.g. 0.5)") from None
    if not (math.isfinite(kappa) and kappa >= 0):
        raise click.BadParameter(f"{value!r}: give 'auto' or a finite number >= 0")
    return kappa


def defense_from(knobs: dict[str, object]) -> object:
    """The :class:`~hybriddp.server.anchor.AnchorPolicy` (or None) of the popped ``--defense`` options."""
    from hybriddp.server.anchor import policy_named

    return policy_named(str(knobs.pop("defense", "anchor")), knobs.pop("anchor_alpha"),  # type: ignore[arg-type]
                        knobs.pop("anchor_kappa"), knobs.pop("anchor_kappa_query"),  # type: ignore[arg-type]
                        knobs.pop("anchor_honest_cost"), knobs.pop("anchor_rank_cost"))  # type: ignore[arg-type]


def check_output(output: str | None) -> None:
    """--output must be writable: checked before anything is loaded or computed."""
    if output:
        from hybriddp.core.atomic import check_output_path
        from hybriddp.server.result import OUTPUT_SUFFIXES
        check_output_path(output, "--output", OUTPUT_SUFFIXES)
