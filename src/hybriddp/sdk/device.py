"""One device's client (a client in the paper, ALGORITHM.md §5): fetch and verify the head list,
randomize on the device after charging its ledger, submit, and keep an outbox until acknowledged."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from hybriddp.core.errors import HybridDPError, parameter_error
from hybriddp.core.protocol import check_message_id, validate_headlist
from hybriddp.core.tokens import RoundKey, TokenRequest, message_payload
from hybriddp.device.ledger import DeviceLedger, DeviceLedgerRefusal, default_device_ledger_path, open_device_ledger
from hybriddp.device.localalg import randomize_records
from hybriddp.sdk.http import (
    NDJSON,
    BodyTooLargeError,
    ServiceHttp,
    ServiceRequestError,
    ServiceUnavailableError,
    chunked,
    fetch_local_search,
    fetch_results,
    response_json,
    round_path,
)

MEAN_ROUND_FORMAT = "hybriddp-mean-round"
"""The ``format`` of a mean round's device document (bounds and ε instead of a head list)."""


def _check_mean_document(doc: dict[str, Any], source: str) -> None:
    """A mean round's device document: finite bounds lower < upper, ε > 0, and its content hash."""
    from hybriddp.core.protocol import DeviceError, content_hash
    from hybriddp.device.mean import NumericRandomizer

    try:
        NumericRandomizer(lower=doc["lower"], upper=doc["upper"], epsilon=doc["epsilon"])
    except (KeyError, TypeError, HybridDPError) as exc:
        raise DeviceError(f"{source}: the mean round's document is not usable ({exc})") from None
    if doc.get("content_hash") != content_hash(doc):
        raise DeviceError(f"{source}: field 'content_hash' = {str(doc.get('content_hash'))[:30]!r} does not match "
                          "the content: the document was altered on the way. Retry later.")


@dataclass
class Acknowledgement:
    """The server's answer to submitted messages: all acknowledged, ``counted`` new, ``duplicates`` seen before."""

    acknowledged: int = 0
    counted: int = 0
    duplicates: int = 0
    skipped: bool = False  # the device's participation policy sat this round out: nothing was sent or charged

    def __iadd__(self, other: Acknowledgement) -> Acknowledgement:
        self.acknowledged += other.acknowledged
        self.counted += other.counted
        self.duplicates += other.duplicates
        return self


class _Sentinel:
    """A named marker value for a keyword argument."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NO_LEDGER = _Sentinel("DeviceClient.NO_LEDGER")
"""``DeviceClient(..., device_ledger=NO_LEDGER)``: keep no device ledger. TESTS AND SIMULATIONS ONLY."""
_NEXT_TO_LEDGER = _Sentinel("<next to the device ledger>")

SDK_WAY_OUT = ("only tests and simulations may skip the device ledger "
               "(DeviceClient(..., device_ledger=DeviceClient.NO_LEDGER))")
"""The end of a ledger refusal's message from the SDK: how a test or a simulation opts out."""


def outbox_path(ledger_path: str | os.PathLike[str], round_id: str) -> str:
    """The default outbox of a device in a round: ``<ledger path>.outbox-<round id>.json``, beside its ledger."""
    return f"{os.fspath(ledger_path)}.outbox-{quote(round_id, safe='')}.json"


class DeviceClient(ServiceHttp):
    """One device taking part in a round (LocalAlg on the device, ALGORITHM.md §5).

    Guarantee: :meth:`participate` and :meth:`participate_value` charge the device ledger before a report
    leaves and refuse (:class:`~hybriddp.device.ledger.DeviceLedgerRefusal`, nothing sent) a second report in a
    round or one past the device's lifetime budget — unless the ledger is switched off with
    :data:`NO_LEDGER`. A message resent from the outbox is the same report (same id) and is not charged again.

    Parameters
    ----------
    base_url, round_id : the server and the round.
    device_ledger : the device's own ledger: None (the default) for the per-user one,
        :func:`hybriddp.device.ledger.default_device_ledger_path` (budget ε 16, δ 1e-4 when new); a path for the
        ledger in that file; a :class:`~hybriddp.device.ledger.DeviceLedger`; or ``DeviceClient.NO_LEDGER`` for
        none — every report is then charged by nobody, so only tests and simulations of many devices may.
        The ledger is opened at the first participation (reading the round or submitting prepared
        messages never touches it).
    outbox : file holding the one message not yet acknowledged; default beside the device ledger
        (:func:`outbox_path`), none with ``NO_LEDGER``; None for none. :meth:`participate` writes it
        (atomically) before sending and removes it once the server acknowledged; a later call for the
        same head list resends it unchanged (same id: counted once) instead of randomizing again.
    participation : report in one period out of this many of a round series (docs/SERIES.md): the device draws
        its period in each block on the device and keeps it in its ledger (:meth:`DeviceLedger.takes_part`); a round
        of another period is sat out (:meth:`participate` returns ``skipped``). None or 1: every round.
    credential : the device credential (``hdc_…``) with which it gets report tokens (docs/TOKENS.md); needed
        unless the server runs with ``--open-admission``. A token is bound to its message and kept in the outbox
        with it, so a resent message carries the same token.
    retry, timeout : see :class:`RetryPolicy` (device submissions are retried: they are idempotent).

    :meth:`submit` and :meth:`submit_batch` send messages as they are (a relay, or simulated devices) and
    charge no ledger: whoever randomized them charged theirs; :meth:`with_tokens` gets tokens for such messages
    (a relay's credential with as many tokens per round).
    """

    NO_LEDGER = NO_LEDGER

    def __init__(self, base_url: str, round_id: str,
                 device_ledger: DeviceLedger | str | os.PathLike[str] | _Sentinel | None = None, *,
                 outbox: str | os.PathLike[str] | _Sentinel | None = _NEXT_TO_LEDGER, credential: str | None = None,
                 participation: int | None = None, **kw: Any) -> None:
        if not (device_ledger is None or device_ledger is NO_LEDGER
                or isinstance(device_ledger, (DeviceLedger, str, os.PathLike))):
            raise parameter_error("device_ledger", device_ledger, "None (the per-user device ledger), a path, a "
                                  "DeviceLedger, or DeviceClient.NO_LEDGER (tests and simulations only)")
        if not (outbox is None or outbox is _NEXT_TO_LEDGER or isinstance(outbox, (str, os.PathLike))):
            raise parameter_error("outbox", outbox, "a path, or None for no outbox")
        if participation is not None and (isinstance(participation, bool) or not isinstance(participation, int)
                                          or participation < 1):
            raise parameter_error("participation (--one-in)", participation, "an integer >= 1 (one period in R)")
        if participation not in (None, 1) and device_ledger is NO_LEDGER:
            raise parameter_error("participation (--one-in)", participation, "used with a device ledger",
                                  "The ledger keeps which period of each block the device drew.")
        self.participation = participation
        if credential is not None and (not isinstance(credential, str) or not credential.strip()):
            raise parameter_error("credential", "<hidden>", "a device credential string (hdc_…), or None")
        kw.setdefault("timeout", 60.0)
        super().__init__(base_url, **kw)
        self.round_id = round_id
        self._no_ledger = device_ledger is NO_LEDGER
        self._ledger: DeviceLedger | None = device_ledger if isinstance(device_ledger, DeviceLedger) else None
        # the ledger's file when given as a path; None with the per-user default
        self._ledger_file = os.fspath(device_ledger) if isinstance(device_ledger, (str, os.PathLike)) else None
        self._outbox_beside_ledger = outbox is _NEXT_TO_LEDGER
        self._outbox_file = os.fspath(outbox) if isinstance(outbox, (str, os.PathLike)) else None
        self._etag: str | None = None
        self._headlist: dict[str, Any] | None = None
        self._credential = None if credential is None else credential.strip()
        self._token_key: tuple[RoundKey, bool] | None = None

    @property
    def ledger(self) -> DeviceLedger | None:
        """The device ledger charged before a report leaves (opened, and the default one's directory created,
        on first use); None with ``NO_LEDGER``."""
        if self._ledger is None and not self._no_ledger:
            from hybriddp.audit.pld import device_accountant
            self._ledger = open_device_ledger(self._ledger_file, accountant=device_accountant())
        return self._ledger

    @property
    def outbox(self) -> str | None:
        """The outbox file (None: no outbox)."""
        if not self._outbox_beside_ledger:
            return self._outbox_file
        if self._no_ledger:
            return None
        ledger_path = (self._ledger.path if self._ledger is not None else
                       self._ledger_file if self._ledger_file is not None else default_device_ledger_path())
        return outbox_path(ledger_path, self.round_id)

    def _charge(self, charge: Callable[[], Any]) -> Any:
        """Run ``charge`` (which charges the ledger); a refusal becomes one line naming this round and the opt-out."""
        try:
            return charge()
        except DeviceLedgerRefusal as exc:
            raise exc.explained(SDK_WAY_OUT, self.round_id) from None

    # -- the head list --
    def fetch_headlist(self) -> dict[str, Any]:
        """The round's head list, verified (fields, ranges, content hash == ETag); cached by ETag.

        A second call sends ``If-None-Match`` and reuses the cached document on 304 Not Modified.
        """
        what = f"head list of round {self.round_id}"
        headers = {"If-None-Match": self._etag} if self._etag and self._headlist is not None else {}
        resp = self.request("GET", round_path(self.round_id, "/headlist"), what=what, idempotent=True,
                            headers=headers, ok=(200, 304))
        if resp.status_code == 304 and self._headlist is not None:
            return self._headlist
        doc = response_json(resp, what)
        if isinstance(doc, dict) and doc.get("format") == MEAN_ROUND_FORMAT:
            _check_mean_document(doc, f"{what} from {self.base_url}")
        else:
            doc = validate_headlist(doc, f"{what} from {self.base_url}")
        etag = resp.headers.get("etag")
        if etag is not None and etag.strip('W/"') != doc["content_hash"]:
            raise ServiceRequestError(f"{what}: the ETag {etag} does not match the document's content hash "
                                      f"{doc['content_hash'][:19]}…; a proxy or cache altered it. Retry later.")
        self._etag, self._headlist = etag or f'"{doc["content_hash"]}"', doc
        return doc

    @property
    def headlist_cached(self) -> dict[str, Any] | None:
        """The last verified head list (None before :meth:`fetch_headlist`)."""
        return self._headlist

    # -- participating --
    def participate(self, records: Sequence[tuple[str, str | None]]) -> Acknowledgement:
        """Randomize this device's records over the round's head list and submit the message.

        The device ledger is charged before the message leaves, and refuses
        (:class:`~hybriddp.device.ledger.DeviceLedgerRefusal`, nothing sent) a second report for this head list or
        one past the lifetime budget; a message the server did not acknowledge raises
        :class:`ServiceUnavailableError` with ``pending`` set (and stays in the outbox, from which the next
        call resends it uncharged).
        """
        doc = self.fetch_headlist()
        msg = self._outbox_message(doc["content_hash"])
        if msg is None:
            if self._sits_out():
                return Acknowledgement(skipped=True)
            msg = self._charge(lambda: randomize_records(doc, records, ledger=self.ledger, round_id=self.round_id))
            self._write_outbox(msg)
        msg = self._tokened(msg)
        ack = self.submit(msg)
        self._clear_outbox()
        return ack

    def _sits_out(self) -> bool:
        """Whether the participation policy sits this round out: a period of a series whose slot in its block is
        another one. A round of no series is never sat out."""
        if self.participation in (None, 1):
            return False
        series = self.round().get("series")
        if not isinstance(series, dict) or not isinstance(series.get("period"), int):
            return False
        ledger = self.ledger
        assert ledger is not None  # participation needs one (__init__)
        return not ledger.takes_part(str(series.get("id")), series["period"] - 1, self.participation)

    def submit(self, message: dict[str, Any]) -> Acknowledgement:
        """Submit one message (retried: the id makes it idempotent)."""
        try:
            return self._post_messages(json.dumps(message, separators=(",", ":"), allow_nan=False).encode(),
                                       "application/json", 1)
        except ServiceUnavailableError as exc:
            exc.pending = message
            raise

    def submit_batch(self, messages: Iterable[dict[str, Any]], *, chunk: int = 10_000,
                     ndjson: bool = True) -> Acknowledgement:
        """Submit many messages (a relay, or simulated devices): NDJSON (or JSON-array) bodies of at most
        ``chunk`` messages, each retried; a body the server finds too large (413) is split in halves."""
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise parameter_error("chunk", chunk, "an integer >= 1 (messages per request)")
        total = Acknowledgement()
        for part in chunked(messages, chunk):
            total += self._submit_lines([json.dumps(m, separators=(",", ":"), allow_nan=False) for m in part],
                                        ndjson)
        return total

    def _submit_lines(self, lines: list[str], ndjson: bool) -> Acknowledgement:
        body = ("\n".join(lines) + "\n") if ndjson else "[" + ",".join(lines) + "]"
        try:
            return self._post_messages(body.encode("utf-8"), NDJSON if ndjson else "application/json", len(lines))
        except BodyTooLargeError:
            if len(lines) == 1:
                raise
            half = len(lines) // 2
            ack = self._submit_lines(lines[:half], ndjson)
            ack += self._submit_lines(lines[half:], ndjson)
            return ack

    def _post_messages(self, body: bytes, ctype: str, n: int) -> Acknowledgement:
        what = f"submit {n:,} device message{'s' * (n != 1)} to round {self.round_id}"
        try:
            got = self.request_json("POST", round_path(self.round_id, "/reports"), what=what, idempotent=True,
                                    content=body, headers={"Content-Type": ctype})
        except ServiceRequestError as exc:
            if exc.code == "token_required" and self._credential is None:  # the way out, for this client
                raise type(exc)(f"{exc}. This device has no credential: give it one (DeviceClient(..., "
                                "credential=...), `hybriddp participate --credential-file`)", status=exc.status,
                                code=exc.code) from None
            raise
        return Acknowledgement(int(got["acknowledged"]), int(got["counted"]), int(got["duplicates"]))

    # -- mean rounds --
    def participate_value(self, value: float) -> Acknowledgement:
        """Mean rounds: clamp and randomize one value on the device (ALGORITHM.md §11) and submit it.

        The round's document (bounds, ε, content hash) comes from the head-list endpoint; the device
        ledger is charged (ε, 0) under its content hash before the value leaves, refusing a second report
        in the round or one past the lifetime budget as :meth:`participate` does.
        """
        from hybriddp.core.protocol import new_message_id
        from hybriddp.device.mean import NumericRandomizer

        doc = self.fetch_headlist()
        if doc.get("format") != MEAN_ROUND_FORMAT:
            raise ServiceRequestError(f"round {self.round_id} is a BLENDER round, not a mean round; a device takes "
                                      "part with its records (participate(records), `hybriddp participate --input`)")
        msg = self._outbox_message(doc["content_hash"])
        if msg is None:
            randomizer = NumericRandomizer(lower=doc["lower"], upper=doc["upper"], epsilon=doc["epsilon"])
            report = randomizer.randomize(value)  # checks the value before the ledger is charged
            ledger = self.ledger
            if ledger is not None:
                self._charge(lambda: ledger.record(doc["content_hash"], float(doc["epsilon"]), 0.0))
            msg = {"id": new_message_id(), "round": self.round_id, "value": report, "headlist": doc["content_hash"]}
            self._write_outbox(msg)
        msg = self._tokened(msg)
        ack = self.submit({k: v for k, v in msg.items() if k != "headlist"})
        self._clear_outbox()
        return ack

    # -- report tokens (docs/TOKENS.md) --
    def token_key(self) -> tuple[RoundKey, bool]:
        """The round's token key, checked, and whether the server needs tokens (False: ``--open-admission``)."""
        if self._token_key is None:
            what = f"report-token key of round {self.round_id}"
            doc = self.request_json("GET", round_path(self.round_id, "/token-key"), what=what, idempotent=True)
            try:
                key = RoundKey.from_dict(doc, self.round_id)
            except HybridDPError as exc:
                raise ServiceRequestError(f"{what} from {self.base_url}: {exc}") from None
            self._token_key = (key, doc.get("admission") != "open")
        return self._token_key

    def with_tokens(self, messages: Sequence[dict[str, Any]], *, chunk: int = 1000) -> list[dict[str, Any]]:
        """The messages, each with a report token for it (messages that have one keep it), got with this
        client's credential in requests of at most ``chunk`` tokens. Unchanged when the server needs none."""
        key, needed = self.token_key()
        todo = [i for i, m in enumerate(messages) if "token" not in m]
        if not needed or not todo:
            return list(messages)
        if self._credential is None:
            raise ServiceRequestError(f"round {self.round_id}: this server takes reports only with a report token, "
                                      "and tokens need a device credential (DeviceClient(..., credential=...), "
                                      "`hybriddp participate --credential-file`); the administrator makes them with "
                                      "`hybriddp credentials create`")
        out = list(messages)
        auth = {"Authorization": f"Bearer {self._credential}"}
        for part in chunked(todo, chunk):
            reqs = [TokenRequest.make(key, out[i]["id"], message_payload(out[i])) for i in part]
            what = f"get {len(part):,} report token{'s' * (len(part) != 1)} for round {self.round_id}"
            # not retried: a lost answer would use up tokens; the caller tries again (a fresh blinding)
            got = self.request_json("POST", round_path(self.round_id, "/tokens"), what=what, idempotent=False,
                                    json_body={"blinded_msgs": [r.blinded for r in reqs]}, headers=auth)
            sigs = got.get("blind_sigs") if isinstance(got, dict) else None
            if not isinstance(sigs, list) or len(sigs) != len(part):
                raise ServiceRequestError(f"{what}: the answer has no list of {len(part)} blind_sigs")
            for i, req, sig in zip(part, reqs, sigs, strict=True):
                try:
                    out[i] = {**out[i], "token": req.finalize(sig)}
                except HybridDPError as exc:
                    raise ServiceRequestError(f"{what}: {exc}") from None
        return out

    def _tokened(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``msg`` with its token (got now if it has none and this device has a credential), kept in the outbox
        with it. Without a credential the message goes as it is: a server that needs tokens refuses it (403)."""
        if "token" in msg or self._credential is None:
            return msg
        (out,) = self.with_tokens([msg], chunk=1)
        if out is not msg:
            self._write_outbox(out)
        return out

    # -- the outbox --
    def _outbox_message(self, headlist_hash: str) -> dict[str, Any] | None:
        outbox = self.outbox
        if outbox is None or not os.path.exists(outbox):
            return None
        try:
            with open(outbox, encoding="utf-8") as fh:
                msg = json.load(fh)
            check_message_id(msg.get("id"))
        except (OSError, ValueError, AttributeError, HybridDPError) as exc:
            raise ServiceRequestError(f"outbox {outbox} cannot be read ({exc}); it should hold one device "
                                      "message. Move it away to participate again") from None
        return msg if msg.get("headlist") == headlist_hash else None

    def _write_outbox(self, msg: dict[str, Any]) -> None:
        outbox = self.outbox
        if outbox is not None:
            from hybriddp.core.atomic import write_text
            write_text(outbox, json.dumps(msg))

    def _clear_outbox(self) -> None:
        outbox = self.outbox
        if outbox is not None:
            try:
                os.unlink(outbox)
            except FileNotFoundError:
                pass

    def round(self) -> dict[str, Any]:
        """The round's state, parameters and counts (anyone may read them)."""
        what = f"round {self.round_id}"
        return self.request_json("GET", round_path(self.round_id), what=what, idempotent=True)

    def results(self, fmt: str = "json") -> Any:
        """The round's published results (anyone may read them)."""
        return fetch_results(self, self.round_id, fmt)

    def local_search(self) -> dict[str, Any]:
        """The round's local-search document."""
        return fetch_local_search(self, self.round_id)
