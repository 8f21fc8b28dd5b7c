"""The operator's client of the collection service: rounds, series, enrolment, the head list, results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybriddp.core.errors import parameter_error
from hybriddp.sdk.http import (
    API,
    ServiceHttp,
    ServiceRequestError,
    fetch_local_search,
    fetch_results,
    fetch_series,
    fetch_series_trends,
    round_path,
    series_path,
)


class AdminClient(ServiceHttp):
    """The operator of the service (admin bearer token).

    >>> admin = AdminClient("http://127.0.0.1:8000", token)            # doctest: +SKIP
    >>> rnd = admin.create_round("blender", {"epsilon": 4, "delta": 1e-5})  # doctest: +SKIP
    """

    def __init__(self, base_url: str, token: str, **kw: Any) -> None:
        if not isinstance(token, str) or not token.strip():
            raise parameter_error("admin token", "<empty>", "the token `hybriddp serve` was started with "
                                  "(--admin-token-file, or the HYBRIDDP_ADMIN_TOKEN environment variable)")
        kw.setdefault("timeout", 600.0)  # closing a round of millions of reports takes seconds
        super().__init__(base_url, token=token.strip(), **kw)

    def create_round(self, kind: str = "blender", params: dict[str, Any] | None = None, *, name: str | None = None,
                     seed: int | None = None, retention_hours: float | None = None) -> dict[str, Any]:
        """Create a round (state collecting-optin). ``seed``: experiments only, no privacy (refused unless the
        server runs with ``--insecure-testing-seeds``). ``retention_hours``: raw opt-in data are purged that
        long after creation at the latest (server default: a week)."""
        body: dict[str, Any] = {"kind": kind, "params": dict(params or {})}
        if name is not None:
            body["name"] = name
        if retention_hours is not None:
            body["retention_hours"] = retention_hours
        if seed is not None:
            body["params"]["seed"] = seed
        return self.request_json("POST", f"{API}/rounds", what="create round", idempotent=False, json_body=body,
                                 ok=(201, 200))

    def round(self, round_id: str) -> dict[str, Any]:
        """One round's state, parameters and counts."""
        what = f"round {round_id}"
        return self.request_json("GET", round_path(round_id), what=what, idempotent=True)

    def rounds(self) -> list[dict[str, Any]]:
        """Every round, newest first as the server lists them."""
        return self.request_json("GET", f"{API}/rounds", what="list rounds", idempotent=True)["rounds"]

    # -- device credentials (report tokens, docs/TOKENS.md) --
    def create_credentials(self, count: int = 1, *, tokens_per_round: int = 1,
                           label: str | None = None) -> list[dict[str, Any]]:
        """``count`` new device credentials, each ``{"id", "credential", "tokens_per_round", ...}``: the secret is
        shown only here (the server keeps its hash). A device needs one token per round; a relay more."""
        body: dict[str, Any] = {"count": count, "tokens_per_round": tokens_per_round}
        if label is not None:
            body["label"] = label
        return self.request_json("POST", f"{API}/device-credentials", what="create device credentials",
                                 idempotent=False, json_body=body, ok=(201,))["credentials"]

    def credentials(self) -> list[dict[str, Any]]:
        """Every device credential (never their secrets)."""
        return self.request_json("GET", f"{API}/device-credentials", what="list device credentials",
                                 idempotent=True)["credentials"]

    def revoke_credential(self, credential_id: int) -> dict[str, Any]:
        """Revoke a device credential: it gets no more tokens (tokens it already got stay valid)."""
        return self.request_json("DELETE", f"{API}/device-credentials/{int(credential_id)}",
                                 what=f"revoke device credential {credential_id}", idempotent=True)

    def enrol(self, round_id: str, user: str) -> str:
        """Enrol one opt-in user; returns the user's upload token (shown once, never stored by the server)."""
        what = f"enrol a user in round {round_id}"
        return self.request_json("POST", round_path(round_id, "/optin/enrol"), what=what, idempotent=False,
                                 json_body={"user": user}, ok=(201, 200))["token"]

    def enrol_many(self, round_id: str, users: Sequence[str], *, chunk: int = 10_000) -> list[str]:
        """Enrol users in order (their order is the curator's user order); one token per user."""
        what = f"enrol users in round {round_id}"
        tokens: list[str] = []
        for i in range(0, len(users), chunk):
            part = list(users[i:i + chunk])
            got = self.request_json("POST", round_path(round_id, "/optin/enrol"), what=what, idempotent=False,
                                    json_body={"users": part}, ok=(201, 200)).get("tokens")
            if not isinstance(got, list) or len(got) != len(part):
                raise ServiceRequestError(f"{what}: the server answered without one token per user")
            tokens.extend(got)
        return tokens

    def publish_headlist(self, round_id: str, *, vocabulary: dict[str, list[str]] | None = None) -> dict[str, Any]:
        """Build the head list from the uploaded opt-in records, charge the ledger, publish, delete raw data.

        ``vocabulary`` (seeded experiment rounds only): the order of the query and URL codes
        ``{"queries": [...], "urls": [...]}``, so the build reproduces a seeded simulation.
        """
        what = f"publish the head list of round {round_id}"
        body = {"vocabulary": vocabulary} if vocabulary is not None else None
        return self.request_json("POST", round_path(round_id, "/headlist"), what=what, idempotent=False,
                                 json_body=body)

    def abort(self, round_id: str) -> dict[str, Any]:
        """End a round still collecting opt-in data; its raw opt-in data are deleted (nothing is charged)."""
        what = f"abort round {round_id}"
        return self.request_json("POST", round_path(round_id, "/abort"), what=what, idempotent=False)

    def delete_round(self, round_id: str) -> dict[str, Any]:
        """Delete a round's raw data, tokens, reports, documents and results (its ledger charges stay)."""
        what = f"delete round {round_id}"
        return self.request_json("DELETE", round_path(round_id), what=what, idempotent=True)

    def ledger(self) -> dict[str, Any]:
        """The service's privacy ledger: per-round totals and per-pseudonym spend (no identities)."""
        what = "read the ledger"
        return self.request_json("GET", f"{API}/ledger", what=what, idempotent=True)

    def close(self, round_id: str, flagged: str = "hold") -> dict[str, Any]:
        """Close the round (reports are refused from now on) and compute its results. ``flagged``: what to do when
        the check against the opt-in group flags them (docs/ALGORITHM.md §7.2): ``hold`` them for
        :meth:`publish_results` (state results-held), ``publish`` them, or publish them without the flagged
        entries (``remove``)."""
        what = f"close round {round_id}"
        return self.request_json("POST", round_path(round_id, "/close"), what=what, idempotent=False,
                                 json_body={"flagged": flagged})

    def publish_results(self, round_id: str, flagged: str = "keep") -> dict[str, Any]:
        """Publish held results (state results-held): as they are (``keep``) or without the flagged entries
        (``remove``)."""
        what = f"publish the held results of round {round_id}"
        return self.request_json("POST", round_path(round_id, "/results/publish"), what=what, idempotent=False,
                                 json_body={"flagged": flagged})

    def results(self, round_id: str, fmt: str = "json") -> Any:
        """The results: a dict for ``json``, the bytes of the records table for ``csv`` / ``parquet``."""
        if fmt not in ("json", "csv", "parquet"):
            raise parameter_error("results format", fmt, "json, csv or parquet")
        return fetch_results(self, round_id, fmt)

    def local_search(self, round_id: str) -> dict[str, Any]:
        """The compact local-search document (queries, their URLs, blended probabilities)."""
        return fetch_local_search(self, round_id)

    def release(self, round_id: str) -> dict[str, Any]:
        """The published inputs of the result: head list, opt-in estimates, report counts per entry."""
        what = f"release of round {round_id}"
        return self.request_json("GET", round_path(round_id, "/release"), what=what, idempotent=True)


    # -- round series (docs/SERIES.md) --
    def create_series(self, kind: str = "blender", params: dict[str, Any] | None = None, *, period_seconds: float,
                      periods: int, optin_seconds: float | None = None, start: str | None = None,
                      name: str | None = None, flagged: str = "hold", retention_hours: float | None = None,
                      first_round: str | None = None, carry: int | None = None) -> dict[str, Any]:
        """A series of ``periods`` rounds of ``period_seconds`` each, opened, published and closed on schedule
        (``start``: ISO 8601, default now; ``optin_seconds``: each period's opt-in window, default half the period;
        ``first_round``: a round still collecting opt-in data that becomes period 1; ``carry``: periods a record the
        head list selected stays listed, default 4 for BLENDER, docs/ALGORITHM.md §13.1)."""
        body: dict[str, Any] = {"kind": kind, "params": dict(params or {}), "period_seconds": period_seconds,
                                "periods": periods, "flagged": flagged}
        for key, value in (("optin_seconds", optin_seconds), ("start", start), ("name", name),
                           ("retention_hours", retention_hours), ("first_round", first_round), ("carry", carry)):
            if value is not None:
                body[key] = value
        return self.request_json("POST", f"{API}/series", what="create series", idempotent=False, json_body=body,
                                 ok=(201, 200))

    def series(self, series_id: str) -> dict[str, Any]:
        """A series: its schedule, each period's round and state, and what the budget admits per user."""
        return fetch_series(self, series_id)

    def series_list(self) -> list[dict[str, Any]]:
        """Every series, oldest first."""
        return self.request_json("GET", f"{API}/series", what="list series", idempotent=True)["series"]

    def advance_series(self, series_id: str, *, step: bool = False) -> dict[str, Any]:
        """Do what the schedule says is due now (``step``: the next action at once); the answer's ``actions`` says
        what was done."""
        return self.request_json("POST", series_path(series_id, "/advance"), what=f"advance series {series_id}",
                                 idempotent=False, json_body={"step": step})

    def cancel_series(self, series_id: str) -> dict[str, Any]:
        """Open no more periods (the current round is left as it is)."""
        return self.request_json("POST", series_path(series_id, "/cancel"), what=f"cancel series {series_id}",
                                 idempotent=False)

    def series_trends(self, series_id: str, *, window: int | None = None, fdr: float = 0.05,
                      min_change: float = 0.0) -> dict[str, Any]:
        """Rising and falling queries across the series' published periods (ALGORITHM.md §13); ``window`` None: the
        server's default (the answer's ``window``)."""
        return fetch_series_trends(self, series_id, window=window, fdr=fdr, min_change=min_change)
