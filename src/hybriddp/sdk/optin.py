"""The opt-in users' clients: one user's upload (:class:`OptinUploader`), many users' (:class:`OptinRelay`).

This is the only path raw data takes to the service (ALGORITHM.md §3's opt-in group): each upload is
authenticated by the token the operator gave the user at enrolment.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from hybriddp.core.errors import parameter_error
from hybriddp.sdk.http import NDJSON, ServiceHttp, chunked, round_path

OPTIN_KEY = "optin:"
"""A device ledger keys an opt-in round's charge by this prefix and the round id (a device round: its head list)."""


class OptinUploader(ServiceHttp):
    """One opt-in user of one round: uploads raw records with the token from enrolment.

    ``device_ledger``: this person's device ledger (:class:`~hybriddp.device.ledger.DeviceLedger`). Before the first
    upload the round's (ε, δ) is recorded there too (key ``optin:<round id>``; once, whatever the retries), so a
    person who is an opt-in user in one period and a device in another has one ledger that counts both and refuses
    past its lifetime budget (docs/SERIES.md, "Moving between groups"). The service's own ledger charges the opt-in
    round all the same; it never learns about devices."""

    def __init__(self, base_url: str, round_id: str, token: str, *, device_ledger: Any = None, **kw: Any) -> None:
        if not isinstance(token, str) or not token:
            raise parameter_error("opt-in token", token, "the token the operator gave at enrolment")
        super().__init__(base_url, token=token, **kw)
        self.round_id = round_id
        self.device_ledger = device_ledger

    def _charge_device_ledger(self) -> None:
        """Record this opt-in round in the device ledger (a refusal: nothing uploaded)."""
        if self.device_ledger is None:
            return
        key = OPTIN_KEY + self.round_id
        if key in self.device_ledger.state["rounds"]:
            return  # a retried or continued upload of the same round
        rnd = self.request_json("GET", round_path(self.round_id), what=f"round {self.round_id}", idempotent=True)
        params = rnd.get("params") or {}
        delta = float(params.get("delta", 0.0)) if rnd.get("kind") == "blender" else 0.0
        self.device_ledger.record(key, float(params["epsilon"]), delta)

    def upload(self, records: Iterable[tuple[str, str | None]], *, chunk: int = 50_000) -> int:
        """Upload (query, url) records (url None when there is none), in order; returns how many were stored.

        The server keys each chunk by its content (keyed hash), so a chunk resent after a lost answer, or
        the same records uploaded again, are acknowledged and not stored twice: uploads are retried like
        any idempotent request, and a repeat is not counted in the return value.
        """
        what = f"upload opt-in records to round {self.round_id}"
        path = round_path(self.round_id, "/optin/records")
        self._charge_device_ledger()
        accepted = 0
        for part in chunked(({"query": q, "url": u} for q, u in records), chunk):
            body = {"records": part}
            accepted += int(self.request_json("POST", path, what=what, idempotent=True, json_body=body)["accepted"])
        return accepted

    def upload_values(self, values: Iterable[float]) -> int:
        """Mean rounds: upload raw numeric values; returns how many were accepted."""
        what = f"upload opt-in values to round {self.round_id}"
        body = {"values": [float(v) for v in values]}
        self._charge_device_ledger()
        return int(self.request_json("POST", round_path(self.round_id, "/optin/records"), what=what,
                                     idempotent=True, json_body=body)["accepted"])


class OptinRelay(ServiceHttp):
    """Forwards the uploads of many opt-in users at once (a collection relay, or a simulation): NDJSON bodies,
    one line per user with that user's own token, ``{"token": ..., "records": [...]}`` (mean rounds:
    ``"values"``). The server stores each body in one transaction or refuses it whole. Not retried once sent."""

    def __init__(self, base_url: str, round_id: str, **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self.round_id = round_id

    def upload_many(self, uploads: Iterable[tuple[str, Sequence[Any]]], *, values: bool = False,
                    max_body_bytes: int = 8 << 20) -> int:
        """Upload ``(token, records)`` pairs (or ``(token, values)`` with ``values=True``), in order, in bodies of
        at most ``max_body_bytes`` (one user's line may exceed it alone); returns how many items were accepted."""
        what = f"upload opt-in {'values' if values else 'records'} of several users to round {self.round_id}"
        path = round_path(self.round_id, "/optin/records")
        accepted, lines, size = 0, [], 0

        def send() -> int:
            return int(self.request_json("POST", path, what=what, idempotent=False, content=b"".join(lines),
                                         headers={"Content-Type": NDJSON})["accepted"])

        for token, items in uploads:
            body = ({"token": token, "values": [float(v) for v in items]} if values else
                    {"token": token, "records": [{"query": q, "url": u} for q, u in items]})
            line = json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"
            if lines and size + len(line) > max_body_bytes:
                accepted += send()
                lines, size = [], 0
            lines.append(line)
            size += len(line)
        if lines:
            accepted += send()
        return accepted

