"""A device's report tokens (docs/TOKENS.md): the round's committed key checked, tokens got on a connection of
their own, and the consistency check against a mirror. The token half of :class:`hybriddp.sdk.device.DeviceClient`.

Guarantee: no token is asked for and no report leaves unless the round's key is the one the head list commits to
(``token_key``: key id, 2048-bit modulus, e = 65537), the head list is the one a mirror sees (when there is one),
and, through a relay, the head list commits to the gateway key the relay path uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from hybriddp.core.errors import HybridDPError
from hybriddp.core.tokens import RoundKey, TokenRequest, check_committed_key, spend, unb64
from hybriddp.sdk.http import (
    ServiceHttp,
    ServiceRequestError,
    ServiceUnavailableError,
    chunked,
    new_client,
    round_path,
)


class DeviceTokens(ServiceHttp):
    """Report tokens and key checks of one device in one round (module docstring); :class:`DeviceClient` sets the
    attributes below and provides :meth:`fetch_headlist` and :meth:`_rewrite_outbox`."""

    round_id: str
    mirror: str | None
    _credential: str | None
    _relay_transport: Any
    _token_key: tuple[RoundKey, bool] | None
    _headlist: dict[str, Any] | None

    if TYPE_CHECKING:  # DeviceClient's
        def fetch_headlist(self) -> dict[str, Any]: ...

        def _rewrite_outbox(self, msg: dict[str, Any]) -> None: ...

    def token_key(self, headlist: dict[str, Any] | None = None) -> tuple[RoundKey, bool]:
        """The round's token key, checked against what the head list commits to (``token_key``: key id, 2048-bit
        modulus, e = 65537), and whether the server needs tokens (False: ``--open-admission``).

        A key that is not the committed one is refused before anything is sent (:class:`ServiceRequestError`):
        a server handing out per-device keys could tell later which device a token came from."""
        if self._token_key is None:
            doc = self.fetch_headlist() if headlist is None else headlist
            self._check_consistent(doc)
            what = f"report-token key of round {self.round_id}"
            got = self.request_json("GET", round_path(self.round_id, "/token-key"), what=what, idempotent=True)
            needed = not (isinstance(got, dict) and got.get("admission") == "open")
            try:
                key = RoundKey.from_dict(got, self.round_id)
                if needed:  # a head list without the field is refused too (from_dict takes None as "no check")
                    check_committed_key(key, doc.get("token_key"))
            except HybridDPError as exc:
                raise ServiceRequestError(f"{what} from {self.base_url}: {exc}") from None
            self._token_key = (key, needed)
        return self._token_key

    def _check_consistent(self, doc: dict[str, Any]) -> None:
        """Refuse (nothing sent) a head list that differs from the mirror's copy, or, through a relay, one that
        does not commit to the gateway key the relay path uses (docs/TOKENS.md "One key per round")."""
        if self._relay_transport is not None:
            committed = doc.get("ohttp_key")
            have = self._relay_transport.key_config
            if committed is None or unb64(committed, "ohttp_key") != have:
                raise ServiceRequestError(f"round {self.round_id}: the relay's gateway key is not the one the head "
                                          "list commits to (field 'ohttp_key'); nothing was sent")
        if self.mirror is None:
            return
        what = f"head list of round {self.round_id} from the mirror {self.mirror}"
        with new_client(self.http.timeout) as plain:
            try:
                resp = plain.get(self.mirror + round_path(self.round_id, "/headlist"),
                                 headers={"Accept": "application/json"})
                other = resp.json() if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError) as exc:
                raise ServiceUnavailableError(f"{what}: {exc or type(exc).__name__}; nothing was sent") from None
        if not isinstance(other, dict) or other.get("content_hash") != doc["content_hash"]:
            theirs = other.get("content_hash") if isinstance(other, dict) else f"HTTP {resp.status_code}"
            raise ServiceRequestError(f"round {self.round_id}: the server gave this device head list "
                                      f"{doc['content_hash'][:19]}…, the mirror sees {str(theirs)[:19]}…: the server "
                                      "may be telling devices apart (by keys committed in their head lists). Nothing "
                                      "was sent")

    def _token_for(self, doc: dict[str, Any]) -> str | None:
        """The device's report token for the round, got now on a connection of its own; None without a credential
        or when the server needs no tokens."""
        if self._credential is None:
            self._check_consistent(doc)
            return None
        key, needed = self.token_key(doc)
        if not needed:
            return None
        with self._own_connection():
            return self._issue(key, 1)[0]

    def _issue(self, key: RoundKey, n: int) -> list[str]:
        """``n`` report tokens with fresh random nonces, in one request with this client's credential."""
        if self._credential is None:
            raise ServiceRequestError(f"round {self.round_id}: this server takes reports only with a report token, "
                                      "and tokens need a device credential (DeviceClient(..., credential=...), "
                                      "`hybriddp participate --credential-file`); the administrator makes them with "
                                      "`hybriddp credentials create`")
        reqs = [TokenRequest.make(key) for _ in range(n)]
        what = f"get {n:,} report token{'s' * (n != 1)} for round {self.round_id}"
        # not retried: a lost answer would use up tokens; the caller tries again (a fresh blinding)
        got = self.request_json("POST", round_path(self.round_id, "/tokens"), what=what, idempotent=False,
                                json_body={"blinded_msgs": [r.blinded for r in reqs]},
                                headers={"Authorization": f"Bearer {self._credential}"})
        sigs = got.get("blind_sigs") if isinstance(got, dict) else None
        if not isinstance(sigs, list) or len(sigs) != n:
            raise ServiceRequestError(f"{what}: the answer has no list of {n} blind_sigs")
        try:
            return [req.finalize(sig) for req, sig in zip(reqs, sigs, strict=True)]
        except HybridDPError as exc:
            raise ServiceRequestError(f"{what}: {exc}") from None

    def with_tokens(self, messages: Sequence[dict[str, Any]], *, chunk: int = 1000) -> list[dict[str, Any]]:
        """The messages, each with a report token (messages that have one keep it) and the id its nonce gives, got
        with this client's credential in requests of at most ``chunk`` tokens. Unchanged when the server needs
        none. For relays and simulations: the tokens are got and spent at once, which lets the server link them."""
        key, needed = self.token_key()
        todo = [i for i, m in enumerate(messages) if "token" not in m]
        if not needed or not todo:
            return list(messages)
        out = list(messages)
        for part in chunked(todo, chunk):
            for i, tok in zip(part, self._issue(key, len(part)), strict=True):
                out[i] = spend(out[i], tok)
        return out

    def _tokened(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``msg`` with its token (got now if it has none — its first try failed — and this device has a
        credential), kept in the outbox with it. Without a credential the message goes as it is: a server that
        needs tokens refuses it (403)."""
        if "token" in msg or self._credential is None:
            return msg
        token = self._token_for(self._headlist or self.fetch_headlist())
        if token is None:
            return msg
        out = spend(msg, token)
        self._rewrite_outbox(out)
        return out

    @contextlib.contextmanager
    def _own_connection(self) -> Iterator[None]:
        """Requests inside use a new connection, closed after, so that the server cannot tie them to the device's
        other requests by the connection (through a relay, every request is on the relay's connections anyway)."""
        if self._relay_transport is not None:
            yield
            return
        shared = self.http
        self.http = new_client(shared.timeout)
        try:
            yield
        finally:
            self.http.close()
            self.http = shared
