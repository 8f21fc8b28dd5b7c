"""One device's client (a client in the paper, ALGORITHM.md §5): fetch and verify the head list,
randomize on the device after charging its ledger, submit, and keep an outbox until acknowledged."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from hybriddp.core.errors import HybridDPError, parameter_error
from hybriddp.core.protocol import check_message_id, validate_headlist
from hybriddp.core.tokens import (
    RoundKey,
    report_time,
    report_window,
    spend,
)
from hybriddp.device.ledger import DeviceLedger, DeviceLedgerRefusal, default_device_ledger_path, open_device_ledger
from hybriddp.device.localalg import randomize_records
from hybriddp.sdk.device_tokens import DeviceTokens
from hybriddp.sdk.http import (
    NDJSON,
    BodyTooLargeError,
    ServiceRequestError,
    ServiceUnavailableError,
    check_base_url,
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
    from hybriddp.core.protocol import DeviceError, check_round_commitments, content_hash
    from hybriddp.device.mean import NumericRandomizer

    try:
        NumericRandomizer(lower=doc["lower"], upper=doc["upper"], epsilon=doc["epsilon"])
    except (KeyError, TypeError, HybridDPError) as exc:
        raise DeviceError(f"{source}: the mean round's document is not usable ({exc})") from None
    check_round_commitments(doc, source)
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
    pending: bool = False  # randomized and kept in the outbox, to be sent at ``send_at`` (:meth:`send_due`)
    send_at: float | None = None  # when the message is (or was) sent, epoch seconds

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


class DeviceClient(DeviceTokens):
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
        (:func:`outbox_path`), none with ``NO_LEDGER``; None for none (the message is then held by this object
        only, until it is sent, and lost with it). :meth:`participate` writes it
        (atomically) before sending and removes it once the server acknowledged; a later call for the
        same head list resends it unchanged (same id: counted once) instead of randomizing again.
    participation : report in one period out of this many of a round series (docs/SERIES.md): the device draws
        its period in each block on the device and keeps it in its ledger (:meth:`DeviceLedger.takes_part`); a round
        of another period is sat out (:meth:`participate` returns ``skipped``). None or 1: every round.
    credential : the device credential (``hdc_…``) with which it gets report tokens (docs/TOKENS.md); needed
        unless the server runs with ``--open-admission``. A token is bound to its message and kept in the outbox
        with it, so a resent message carries the same token.
    report_now : send at once instead of at a random time in the round's report window. TESTS AND SIMULATIONS
        ONLY: the server then sees the token's issuance and the report together and can link them.
    mirror : a second path to the round's documents (a consistency mirror, e.g. a relay's ``/api/v1/...``): the
        head list is fetched there too and the device refuses (nothing sent) unless both have one content hash,
        so a server that tags devices with their own keys must show them different head lists and is caught.
        Default: the relay, when there is one.
    relay : an Oblivious HTTP relay (``hybriddp relay``, run by another party): every request of the device
        (head list, token key, tokens, reports) goes through it encapsulated (RFC 9458), so the server never sees
        the device's address or connection; the gateway key must be the one the head list commits to.
    retry, timeout : see :class:`RetryPolicy` (device submissions are retried: they are idempotent).

    When it reports (docs/TOKENS.md "When a device reports"): :meth:`participate` gets the device's report token
    on a connection of its own as soon as it has the head list, randomizes, keeps the message in the outbox and
    sends it, on another connection, at a uniformly random time in the round's report window (``wait=False``:
    returns ``pending`` and :meth:`send_due` sends it later).

    :meth:`submit` and :meth:`submit_batch` send messages as they are (a relay, or simulated devices) and
    charge no ledger: whoever randomized them charged theirs; :meth:`with_tokens` gets tokens for such messages
    (a relay's credential with as many tokens per round).
    """

    NO_LEDGER = NO_LEDGER

    def __init__(self, base_url: str, round_id: str,
                 device_ledger: DeviceLedger | str | os.PathLike[str] | _Sentinel | None = None, *,
                 outbox: str | os.PathLike[str] | _Sentinel | None = _NEXT_TO_LEDGER, credential: str | None = None,
                 participation: int | None = None, report_now: bool = False, mirror: str | None = None,
                 relay: str | None = None, clock: Callable[[], float] = time.time, **kw: Any) -> None:
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
        if not isinstance(report_now, bool):
            raise parameter_error("report_now (--report-now)", report_now, "true or false")
        kw.setdefault("timeout", 60.0)
        self._relay_transport: Any = None
        if relay is not None:
            if kw.get("client") is not None:
                raise parameter_error("client", "<given>", "left out with relay=: the device's requests go through "
                                      "a client of its own, made on the relay's transport")
            from hybriddp.sdk.relay import OhttpTransport
            self._relay_transport = OhttpTransport(relay)  # checks the URL (naming --relay)
            relay = self._relay_transport.relay_url
            limit = httpx.Timeout(kw["timeout"], connect=min(10.0, kw["timeout"]))
            kw["client"] = httpx.Client(transport=self._relay_transport, timeout=limit)
        super().__init__(base_url, **kw)
        if self._relay_transport is not None:
            self._own = True  # the client made above for the relay is this object's to close
        self.report_now = report_now
        if mirror is not None:
            mirror = check_base_url(mirror, "mirror URL (--mirror)", "the http:// or https:// URL of a second path "
                                    "to the round's documents, such as a relay's (http://127.0.0.1:8081)")
        self.mirror = mirror if mirror is not None else relay
        self._clock = clock
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
        self._held: dict[str, Any] | None = None  # the outbox entry, also without an outbox file

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
    def participate(self, records: Sequence[tuple[str, str | None]], *, wait: bool = True) -> Acknowledgement:
        """Randomize this device's records over the round's head list and send the message at its time.

        The device ledger is charged before the message leaves, and refuses
        (:class:`~hybriddp.device.ledger.DeviceLedgerRefusal`, nothing sent) a second report for this head list or
        one past the lifetime budget. The report token is got now, on a connection of its own; the message is
        kept in the outbox and sent at a uniformly random time in the round's report window (at once with
        ``report_now``): this call sleeps until then, or with ``wait=False`` returns ``pending`` (send it with
        :meth:`send_due`). A message the server did not acknowledge raises :class:`ServiceUnavailableError` with
        ``pending`` set (and stays in the outbox, from which the next call resends it uncharged).
        """
        doc = self.fetch_headlist()
        entry = self._outbox_entry(doc["content_hash"])
        if entry is None:
            if self._sits_out():
                return Acknowledgement(skipped=True)
            token = self._token_for(doc)
            msg = self._charge(lambda: randomize_records(doc, records, ledger=self.ledger, round_id=self.round_id))
            entry = self._keep(doc, msg, token)
        return self._send_when_due(entry, wait)

    def _keep(self, doc: dict[str, Any], msg: dict[str, Any], token: str | None) -> dict[str, Any]:
        """The outbox entry of a new message: with its token (and the id the token gives) and its send time."""
        if token is not None:
            msg = spend(msg, token)
        now = self._clock()
        entry = {"message": msg, "send_at": now if self.report_now else report_time(report_window(doc), now)}
        self._write_outbox(entry)
        return entry

    def _send_when_due(self, entry: dict[str, Any], wait: bool) -> Acknowledgement:
        send_at = float(entry.get("send_at") or 0.0)
        while not self.report_now and (left := send_at - self._clock()) > 0:
            if not wait:
                return Acknowledgement(pending=True, send_at=send_at)
            time.sleep(min(left, 30.0))
        msg = self._tokened(entry["message"])
        with self._own_connection():
            ack = self.submit({k: v for k, v in msg.items() if k != "headlist"} if "value" in msg else msg)
        self._clear_outbox()
        ack.send_at = send_at
        return ack

    def send_due(self, *, wait: bool = False) -> Acknowledgement | None:
        """Send the outbox's message if its time has come (``wait``: sleep until it has); None when the outbox is
        empty, ``pending`` when it is not due yet."""
        entry = self._outbox_entry(None)
        return None if entry is None else self._send_when_due(entry, wait)

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
    def participate_value(self, value: float, *, wait: bool = True) -> Acknowledgement:
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
        entry = self._outbox_entry(doc["content_hash"])
        if entry is None:
            randomizer = NumericRandomizer(lower=doc["lower"], upper=doc["upper"], epsilon=doc["epsilon"])
            report = randomizer.randomize(value)  # checks the value before the ledger is charged
            token = self._token_for(doc)
            ledger = self.ledger
            if ledger is not None:
                self._charge(lambda: ledger.record(doc["content_hash"], float(doc["epsilon"]), 0.0))
            msg = {"id": new_message_id(), "round": self.round_id, "value": report, "headlist": doc["content_hash"]}
            entry = self._keep(doc, msg, token)
        return self._send_when_due(entry, wait)

    # -- the outbox --
    def _outbox_entry(self, headlist_hash: str | None) -> dict[str, Any] | None:
        """The outbox's entry ``{"message", "send_at"}`` if it holds a message for this head list (any, with None)."""
        outbox = self.outbox
        if outbox is None:  # no file: the entry this object holds in memory (lost if the process ends)
            held = self._held
            if held is None or (headlist_hash is not None and held["message"].get("headlist") != headlist_hash):
                return None
            return held
        if not os.path.exists(outbox):
            return None
        try:
            with open(outbox, encoding="utf-8") as fh:
                entry = json.load(fh)
            if "message" not in entry:  # an outbox written before send times: the message alone, sent now
                entry = {"message": entry, "send_at": 0.0}
            check_message_id(entry["message"].get("id"))
        except (OSError, ValueError, AttributeError, KeyError, TypeError, HybridDPError) as exc:
            raise ServiceRequestError(f"outbox {outbox} cannot be read ({exc}); it should hold one device "
                                      "message. Move it away to participate again") from None
        if headlist_hash is not None and entry["message"].get("headlist") != headlist_hash:
            return None
        return entry

    def _rewrite_outbox(self, msg: dict[str, Any]) -> None:
        entry = self._outbox_entry(None)
        self._write_outbox({"message": msg, "send_at": 0.0 if entry is None else entry.get("send_at", 0.0)})

    def _write_outbox(self, msg: dict[str, Any]) -> None:
        self._held = msg
        outbox = self.outbox
        if outbox is not None:
            from hybriddp.core.atomic import write_text
            write_text(outbox, json.dumps(msg))

    def _clear_outbox(self) -> None:
        self._held = None
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
