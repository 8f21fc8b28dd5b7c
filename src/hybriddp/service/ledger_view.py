"""A read-only view of the collection service's privacy ledger, as JSON-able data.

The service charges opt-in users in its own database (tables ``rounds``, ``ledger_charges``,
``ledger_meta``; :mod:`.schema`), under keyed pseudonyms (HMAC-SHA256 with the database's salt), never
under identities. :func:`service_ledger` reads that ledger from a connection (or engine) and
:func:`open_service_ledger` from a database URL; ``hybriddp privacy report`` prints it and an
administrator API can return it as is. Neither migrates nor writes: a database of any schema
version is read as it is (one without ``ledger_charges.private`` reads as all-private), SQLite is
opened read-only and PostgreSQL in a read-only transaction. The salt is never read.

What it returns (ALGORITHM.md §2, PRIVACY.md "What each group is guaranteed"):

* ``rounds``: every round with charges — its id, name, kind, state, whether it was ``private``, the
  (ε, δ) charged (the largest over its groups), the number of users charged and the groups;
* ``pseudonyms``: per charged pseudonym, Σε and Σδ over its **private** charges (basic composition,
  what the service's lifetime budget counts), the number of rounds it was charged in and of
  non-private ones;
* ``lifetime``: the database's lifetime budget per user;
* ``pld_epsilon`` per pseudonym and ``worst_pld_epsilon``: the ε at the lifetime δ by the rule the service enforces,
  the tighter of basic composition and privacy-loss-distribution accounting (ALGORITHM.md §14).

A round is non-private when its charges say so (``private`` false) or its parameters hold a
``seed``: anyone who knows the seed can regenerate the noise, so its users have **no guarantee at
all**. Such charges are listed but left out of the sums, as the service's budget leaves them out;
``users_without_guarantee`` counts the pseudonyms charged in one, and ``warning`` says it.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, and_, case, create_engine, func, inspect, literal, select
from sqlalchemy.exc import NoSuchModuleError, SQLAlchemyError

from hybriddp.core.errors import HybridDPError, parameter_error
from hybriddp.privacy.ledger import LedgerError, non_private_warning
from hybriddp.service import schema as s
from hybriddp.service.store import PSYCOPG_NEEDED, database_url, describe_url

_NEEDED = ("rounds", "ledger_charges", "ledger_meta")


def service_ledger(source: Connection | Engine, *, limit: int | None = None) -> dict[str, Any]:
    """The service's ledger from a connection or engine: rounds, pseudonyms, lifetime budget (module docstring).

    ``limit`` keeps the ``limit`` most-charged pseudonyms (``pseudonyms_total`` is the number of all).
    Only SELECTs are run (on a caller's connection, inside the caller's transaction); the salt is
    never read. Raises :class:`~hybriddp.privacy.ledger.LedgerError` for a database without the ledger's tables.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise parameter_error("limit", limit, "None or an integer ≥ 0")
    if isinstance(source, Engine):
        with source.connect() as conn:
            return _read(conn, limit)
    return _read(source, limit)


def open_service_ledger(url: str, *, limit: int | None = None) -> dict[str, Any]:
    """:func:`service_ledger` of the database at ``url`` (``sqlite:///path`` or ``postgresql+psycopg://...``),
    opened read-only; ``database`` names it (password hidden)."""
    engine = _read_only_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                conn = conn.execution_options(postgresql_readonly=True)
            out = _read(conn, limit)
    except SQLAlchemyError as exc:
        raise LedgerError(f"cannot read the service database {describe_url(url)}: "
                          f"{str(getattr(exc, 'orig', None) or exc).splitlines()[0]}; check the URL and that the "
                          "database server is running") from None
    finally:
        engine.dispose()
    return {"database": describe_url(url), **out}


def _read_only_engine(url: str) -> Engine:
    u = database_url(url, "ledger")
    if u.get_backend_name() == "sqlite":
        path = Path(u.database).expanduser()
        if not path.is_file():
            raise LedgerError(f"service database not found: {path}; give the file `hybriddp serve --db` uses")
        uri = path.resolve().as_uri() + "?mode=ro"  # read-only: nothing can be written, not even a migration
        return create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True))
    try:
        return create_engine(u)
    except (NoSuchModuleError, ImportError):
        raise LedgerError(PSYCOPG_NEEDED) from None


def _read(conn: Connection, limit: int | None) -> dict[str, Any]:
    tables = set(inspect(conn).get_table_names())
    missing = [t for t in _NEEDED if t not in tables]
    if missing:
        raise LedgerError(f"the database has no {', '.join(missing)} table(s): it is not a hybriddp service "
                          "database (give the database `hybriddp serve --db` uses, or a file ledger)")
    lc, r, m = s.ledger_charges.c, s.rounds.c, s.ledger_meta.c
    has_private = "private" in {c["name"] for c in inspect(conn).get_columns("ledger_charges")}
    meta = dict(conn.execute(select(m.key, m.value).where(m.key.in_(["lifetime_epsilon", "lifetime_delta"]))).all())
    info = {int(row.num): row for row in conn.execute(select(r.num, r.id, r.kind, r.name, r.state, r.params,
                                                             r.created)).all()}
    seeded = sorted(num for num, row in info.items() if _seed(row.params) is not None)
    is_private = and_(lc.private.is_(True) if has_private else literal(True), lc.round_num.not_in(seeded))
    flag = case((is_private, 1), else_=0)

    rounds: dict[int, dict[str, Any]] = {}
    for num, grp, n, eps, delta, n_private in conn.execute(
            select(lc.round_num, lc.grp, func.count(), func.max(lc.epsilon), func.max(lc.delta), func.sum(flag))
            .group_by(lc.round_num, lc.grp).order_by(lc.round_num, lc.grp)).all():
        row = info.get(int(num))
        rnd = rounds.setdefault(int(num), {
            "round": row.id if row else None, "name": row.name if row else None, "kind": row.kind if row else None,
            "state": row.state if row else None, "created": row.created if row else None, "private": True,
            "epsilon": 0.0, "delta": 0.0, "users": 0, "groups": []})
        rnd["groups"].append({"group": grp, "users": int(n), "epsilon": float(eps), "delta": float(delta)})
        rnd["users"] += int(n)
        rnd["epsilon"], rnd["delta"] = max(rnd["epsilon"], float(eps)), max(rnd["delta"], float(delta))
        rnd["private"] = rnd["private"] and int(n_private) == int(n)

    sum_eps = func.sum(case((is_private, lc.epsilon), else_=0.0))
    sum_delta = func.sum(case((is_private, lc.delta), else_=0.0))
    n_non_private = func.sum(1 - flag)
    query = (select(lc.user_pseudonym, sum_eps, sum_delta, func.count(lc.round_num.distinct()), n_non_private)
             .group_by(lc.user_pseudonym).order_by(sum_eps.desc(), sum_delta.desc(), lc.user_pseudonym))
    if limit is not None:
        query = query.limit(limit)
    pseudonyms = [{"pseudonym": p, "epsilon": float(e or 0.0), "delta": float(d or 0.0), "rounds": int(k),
                   "non_private_releases": int(np_ or 0)} for p, e, d, k, np_ in conn.execute(query).all()]
    totals = conn.execute(select(func.count(lc.user_pseudonym.distinct()),
                                 func.count(lc.user_pseudonym.distinct()).filter(flag == 0))).one()
    per_user = select(sum_eps.label("e")).group_by(lc.user_pseudonym).subquery()
    worst = conn.execute(select(func.max(per_user.c.e))).scalar()
    lifetime = {"epsilon": _number(meta.get("lifetime_epsilon")), "delta": _number(meta.get("lifetime_delta"))}
    worst = float(worst or 0.0)
    pld_of, worst_pld = _pld_epsilons(conn, info, is_private, lifetime["delta"])
    for p in pseudonyms:
        p["pld_epsilon"] = pld_of.get(p["pseudonym"])
    out: dict[str, Any] = {
        "source": "service", "lifetime": lifetime, "rounds": list(rounds.values()), "pseudonyms": pseudonyms,
        "pseudonyms_total": int(totals[0]), "users": int(totals[0]), "worst_basic_epsilon": worst,
        "worst_pld_epsilon": worst_pld,
        "remaining_epsilon": None if lifetime["epsilon"] is None else max(0.0, lifetime["epsilon"] - worst),
        "users_without_guarantee": int(totals[1])}
    if totals[1]:
        out["warning"] = non_private_warning(int(totals[1]))
    return out


def _pld_epsilons(conn: Connection, info: dict[int, Any], is_private: Any,
                  target_delta: float | None) -> tuple[dict[str, float], float | None]:
    """Per pseudonym, its ε at the lifetime δ by the ledger's rule: the tighter of basic composition and PLD
    accounting of its private rounds' mechanisms (:func:`hybriddp.audit.pld.history_epsilon`, ALGORITHM.md §14);
    and the largest. Users with the same rounds' mechanisms share one computation."""
    if target_delta is None:
        return {}, None
    from hybriddp.audit.pld import history_epsilon, round_mechanism
    lc = s.ledger_charges.c
    histories: dict[str, list[Any]] = {}
    for user, num, eps, delta in conn.execute(select(lc.user_pseudonym, lc.round_num, lc.epsilon, lc.delta)
                                              .where(is_private)).all():
        row = info.get(int(num))
        try:
            mech = round_mechanism(row.kind, json.loads(row.params), (float(eps), float(delta))) if row else None
        except (ValueError, TypeError, KeyError):
            mech = None
        histories.setdefault(user, []).append(mech)
    out: dict[str, float] = {}
    done: dict[tuple[Any, ...], float] = {}
    for user, mechs in histories.items():
        if any(m is None for m in mechs):
            continue  # a round whose parameters cannot be read: basic composition only
        key = tuple(sorted(repr(m) for m in mechs))
        if key not in done:
            try:
                done[key] = history_epsilon(mechs, target_delta)
            except HybridDPError:  # parameters the exact audit does not cover: basic composition only
                done[key] = math.nan
        if not math.isnan(done[key]):
            out[user] = done[key]
    return out, max(out.values()) if out else None


def _seed(params: str | None) -> Any:
    """The seed in a round's parameters (JSON text), or None."""
    try:
        p = json.loads(params or "{}")
    except ValueError:
        return None
    return p.get("seed") if isinstance(p, dict) else None


def _number(text: str | None) -> float | None:
    """A lifetime budget value of ``ledger_meta`` (text), or None when absent or not a finite number."""
    try:
        x = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return x if math.isfinite(x) else None
