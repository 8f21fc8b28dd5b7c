"""The device's own privacy ledger: at most one report per round, within a lifetime budget (ALGORITHM.md §2;
PRIVACY.md). A JSON file, rewritten atomically under a lock; by default in the per-user data directory."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from hybriddp.core.atomic import write_text
from hybriddp.core.protocol import DeviceError, _as_float, _check_number, _kind, _show
from hybriddp.privacy.budget import LifetimeBudget, compose


class DeviceLedgerRefusal(DeviceError):
    """The device ledger refused a charge: this device already reported for the head list, or the charge would
    pass its lifetime budget. Nothing was charged and nothing may be reported.

    ``head_list``: the round's content hash; ``already``: True for a second report in the round, False for the
    lifetime budget; ``charge``: (ε, δ) of the refused report; ``spent`` and ``lifetime``: (Σε, Σδ) so far and
    the budget; ``path``: the ledger file; ``round_id``: the service round, when known. :meth:`explained`
    gives the one-line message a device shows, naming the way out.
    """

    def __init__(self, message: str, *, head_list: str, already: bool, charge: tuple[float, float],
                 spent: tuple[float, float], lifetime: tuple[float, float], path: str,
                 round_id: str | None = None, tighter: float | None = None) -> None:
        super().__init__(message)
        self.head_list, self.already, self.charge = head_list, already, charge
        self.spent, self.lifetime, self.path, self.round_id = spent, lifetime, path, round_id
        self.tighter = tighter  # ε spent by the ledger's tighter accountant, when it has one

    def explained(self, way_out: str, round_id: str | None = None) -> DeviceLedgerRefusal:
        """The same refusal with a one-line message naming the round, what was spent, the lifetime budget and
        ``way_out`` (how a test or a simulation skips the ledger)."""
        rid = round_id if round_id is not None else self.round_id
        where = (f"round {rid} (head list {self.head_list[:19]}…)" if rid is not None
                 else f"head list {self.head_list[:19]}…")
        (e, d), (se, sd), (le, ld) = self.charge, self.spent, self.lifetime
        budget = f"lifetime ε = {le:g}, δ = {ld:g}"
        if self.already:
            what = (f"this device already reported in {where}; a second report would spend ε = {e:g} again "
                    f"(spent so far ε = {se:.4g}, δ = {sd:.3g} of its {budget}; device ledger {self.path})")
        else:
            how = "" if self.tighter is None else f" by basic composition, ε = {self.tighter:.4g} by PLD accounting"
            what = (f"{where}: reporting would spend ε = {e:g}, δ = {d:g} more and pass this device's {budget} "
                    f"(spent so far ε = {se:.4g}{how}, δ = {sd:.3g}; device ledger {self.path})")
        return DeviceLedgerRefusal(f"{what}. No report was sent; {way_out}", head_list=self.head_list,
                                   already=self.already, charge=self.charge, spent=self.spent,
                                   lifetime=self.lifetime, path=self.path, round_id=rid, tighter=self.tighter)


class Accountant(Protocol):
    """A tighter accountant for the device ledger: a history is a list of (ε, δ, shape or None) per round."""

    def within(self, history: list[tuple[float, float, dict[str, Any] | None]], lifetime_epsilon: float,
               lifetime_delta: float) -> bool: ...

    def epsilon(self, history: list[tuple[float, float, dict[str, Any] | None]], delta: float) -> float: ...


class DeviceLedger:
    """The device's own privacy ledger: at most one report per round, within a lifetime budget
    (basic composition over the rounds it reports in, ALGORITHM.md §2; the rule of
    :mod:`hybriddp.privacy.budget`), or a tighter ``accountant`` where it admits more (:class:`Accountant`;
    :func:`open_device_ledger` gives :func:`hybriddp.audit.pld.device_accountant`, privacy-loss-distribution
    accounting of each round kept with its head list's ``shape`` as LocalAlg's exact mechanism, ALGORITHM.md §15).

    A round is identified by the head list's content hash (a mean round's by its document's hash). The
    ledger is a small JSON file ``{"lifetime": {"epsilon": E, "delta": D}, "rounds": {hash: {"epsilon": e,
    "delta": d}}}`` rewritten atomically (temporary file + rename) *before* any report leaves the device; a
    new file is made readable by its owner only (0600). :meth:`record` re-reads the file under an exclusive
    lock on its directory (``flock``; none on Windows), so ledgers open in several processes, or several
    objects on one file, never charge one round twice nor lose each other's charges.

    ``default_lifetime``: the (ε, δ) budget of a new ledger when ``lifetime_epsilon``/``lifetime_delta`` are
    not given (without it a new ledger needs both).
    """

    def __init__(self, path: str | os.PathLike[str], *, lifetime_epsilon: float | None = None,
                 lifetime_delta: float | None = None,
                 default_lifetime: tuple[float, float] | None = None, accountant: Accountant | None = None) -> None:
        self.path = os.fspath(path)
        self.accountant = accountant
        if os.path.isdir(self.path):
            raise DeviceError(f"device ledger {self.path} is a directory; give a file name")
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            if default_lifetime is not None:
                lifetime_epsilon = default_lifetime[0] if lifetime_epsilon is None else lifetime_epsilon
                lifetime_delta = default_lifetime[1] if lifetime_delta is None else lifetime_delta
            self.state = _new_ledger_state(self.path, lifetime_epsilon, lifetime_delta)
            return
        except OSError as exc:
            raise DeviceError(f"cannot read device ledger {self.path}: {exc.strerror or exc}") from None
        self.state = _parse_ledger(data, self.path)
        for name, given in (("epsilon", lifetime_epsilon), ("delta", lifetime_delta)):
            if given is not None and _as_float(given) != self.state["lifetime"][name]:
                raise DeviceError(f"device ledger {self.path} has lifetime {name} {self.state['lifetime'][name]!r}, "
                                  f"not {given!r}: a device's lifetime budget is fixed when its ledger is created; "
                                  f"leave out --lifetime-{name}")

    def spent(self) -> tuple[float, float]:
        """(Σε, Σδ) over the rounds reported so far (basic composition)."""
        rounds = self.state["rounds"].values()
        return math.fsum(r["epsilon"] for r in rounds), math.fsum(r["delta"] for r in rounds)

    def check(self, round_id: str, epsilon: float, delta: float, shape: dict[str, Any] | None = None) -> None:
        """Raise :class:`DeviceLedgerRefusal` (already reported / over budget) or :class:`DeviceError` (a charge
        that is not a finite number >= 0) if :meth:`record` would refuse this round; change nothing.

        Over budget means over it by basic composition *and* by the ledger's tighter accountant, if it has one."""
        life = self.state["lifetime"]
        facts = {"head_list": round_id, "spent": self.spent(), "lifetime": (life["epsilon"], life["delta"]),
                 "path": self.path}
        if round_id in self.state["rounds"]:
            prior = self.state["rounds"][round_id]
            raise DeviceLedgerRefusal(f"this device already reported for head list {round_id[:19]}…; "
                                      "a device reports at most once per round", already=True,
                                      charge=(prior["epsilon"], prior["delta"]), **facts)
        for name, value in (("epsilon", epsilon), ("delta", delta)):
            _check_number(f"the round's {name}", value, "a finite number >= 0", lambda x: 0 <= x < math.inf,
                          "The head list is damaged or not from a hybriddp server; not reporting.")
        e, d = facts["spent"]
        if (LifetimeBudget(life["epsilon"], life["delta"]).exceeded_by(*compose((e, d), (epsilon, delta)))
                and not self._tighter_admits(epsilon, delta, shape)):
            tight = self._tighter_spent()
            how = "" if tight is None else f" by basic composition; epsilon {tight:.4g} by PLD accounting"
            raise DeviceLedgerRefusal(f"reporting would exceed this device's lifetime budget (epsilon "
                                      f"{life['epsilon']}, delta {life['delta']}; spent {e:.4g}, {d:.3g}{how}); not "
                                      "reporting", already=False, charge=(float(epsilon), float(delta)),
                                      tighter=tight, **facts)

    def record(self, round_id: str, epsilon: float, delta: float,
               memo: tuple[str, list[Any], str] | None = None, shape: dict[str, Any] | None = None) -> None:
        """Charge one round, or raise :class:`DeviceError` (already reported / over budget / not saved).

        ``memo``: (records key, reports, service round) kept with the charge, in the same write, for
        :meth:`memoized`. ``shape``: ``{"kq": [...], "f_c": f, "m_c": m}`` of the round's head list (its URLs per
        query, wildcards included), kept with the charge so that PLD accounting can compose LocalAlg exactly.
        Under the ledger's lock the file is read again first, so a charge made meanwhile by another process
        (or another object on the same file) counts.
        """
        with _ledger_lock(self.path):
            self._reload()
            self.check(round_id, epsilon, delta, shape)
            entry: dict[str, Any] = {"epsilon": float(epsilon), "delta": float(delta)}
            if shape is not None:  # checked before the state changes: a refused shape charges nothing
                entry["shape"] = _checked_shape(shape, self.path)
            self.state["rounds"][round_id] = entry
            if memo is not None:
                self.state.setdefault("memo", {})[round_id] = {"records": memo[0], "reports": memo[1],
                                                                "sent_in": [memo[2]]}
            def undo() -> None:
                del self.state["rounds"][round_id]
                self.state.get("memo", {}).pop(round_id, None)
            self._save_or_undo(undo, "nothing was charged, so nothing may be reported")

    def tighter_epsilon(self, delta: float | None = None) -> float | None:
        """This device's total ε at ``delta`` (default its lifetime δ) by the ledger's tighter accountant over the
        rounds it reported in; None without one."""
        if self.accountant is None:
            return None
        target = self.state["lifetime"]["delta"] if delta is None else delta
        return self.accountant.epsilon(self._history(), target)

    def _tighter_spent(self) -> float | None:
        """:meth:`tighter_epsilon` for a message, None if there is no accountant or it cannot say."""
        try:
            return None if self.accountant is None or not self.state["rounds"] else self.tighter_epsilon()
        except (ValueError, KeyError, TypeError, ArithmeticError):
            return None

    def _history(self, extra: tuple[float, float, dict[str, Any] | None] | None = None
                 ) -> list[tuple[float, float, dict[str, Any] | None]]:
        rounds = [(r["epsilon"], r["delta"], r.get("shape")) for r in self.state["rounds"].values()]
        return rounds + ([] if extra is None else [extra])

    def _tighter_admits(self, epsilon: float, delta: float, shape: dict[str, Any] | None) -> bool:
        """Whether the tighter accountant keeps the history plus this round within the lifetime budget (False
        without one, or if it cannot say: basic composition then decides)."""
        if self.accountant is None:
            return False
        life = self.state["lifetime"]
        try:
            return bool(self.accountant.within(self._history((epsilon, delta, shape)), life["epsilon"],
                                               life["delta"]))
        except (ValueError, KeyError, TypeError, ArithmeticError):
            return False

    def memoized(self, round_id: str, service_round: str) -> list[Any] | None:
        """The reports this device sent for head list ``round_id`` if it kept them and has not sent them in
        ``service_round`` yet; None otherwise. Sending them again, in another round with the same head list, is
        post-processing of the same randomized reports: it costs no privacy (ALGORITHM.md §15). Whether they are
        sent does not depend on the device's records now (the kept ``records`` key only says whether the reports
        were made from the same records): a choice that did would tell whether the records changed. The round is
        noted (one message per round)."""
        with _ledger_lock(self.path):
            self._reload()
            memo = self.state.get("memo", {})
            got = memo.get(round_id) if isinstance(memo, dict) else None
            if not (isinstance(got, dict) and isinstance(got.get("reports"), list)
                    and isinstance(got.get("sent_in"), list) and service_round not in got["sent_in"]):
                return None
            got["sent_in"].append(service_round)
            self._save_or_undo(got["sent_in"].pop, "not reporting")
            return list(got["reports"])

    def takes_part(self, series_id: str, period: int, every: int, draw: Callable[[int], int] | None = None) -> bool:
        """Whether this device reports in ``period`` (from 0) of series ``series_id`` under the policy "one period
        in ``every``" (ALGORITHM.md §15): the periods are cut into blocks of ``every``; in each block the device
        draws one slot, uniformly and on the device (``draw(n)``: an integer in [0, n), default the OS's
        ``secrets.randbelow``), the first time it asks about the block, and keeps it in the ledger, so it reports in
        at most one period of each block however often it asks, and in exactly one if it asks at the block's start.
        Which slot it drew never leaves the device."""
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise DeviceError(f"participation: one period in {every!r}? give an integer >= 1")
        if isinstance(period, bool) or not isinstance(period, int) or period < 0:
            raise DeviceError(f"the round's period {period!r} is not an integer >= 0; not reporting")
        if every == 1:
            return True
        key = f"{series_id}/{every}/{period // every}"
        with _ledger_lock(self.path):
            self._reload()
            slots = self.state.setdefault("slots", {})
            if not isinstance(slots, dict) or not isinstance(slots.get(key, 0), int):
                raise DeviceError(f"device ledger {self.path}: field 'slots' is damaged. {_LEDGER_FIX}")
            if key not in slots:
                slot = (draw or secrets.randbelow)(every)
                if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < every:
                    raise DeviceError(f"participation slot {slot!r} is not in [0, {every})")
                slots[key] = slot
                self._save_or_undo(lambda: slots.pop(key), "not reporting")
            return period % every == slots[key]

    def _save_or_undo(self, undo: Callable[[], object], consequence: str) -> None:
        """:meth:`_save`; if the file cannot be written, ``undo`` the change to the state and raise
        :class:`DeviceError` saying so and what follows (``consequence``)."""
        try:
            self._save()
        except OSError as exc:
            undo()
            why = exc.strerror or exc
            raise DeviceError(f"cannot write device ledger {self.path} ({why}); {consequence}") from None

    def _reload(self) -> None:
        """Replace the state with the file's, if the file exists (a new ledger keeps its state)."""
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise DeviceError(f"cannot read device ledger {self.path}: {exc.strerror or exc}") from None
        self.state = _parse_ledger(data, self.path)

    def _save(self) -> None:
        """Replace the file atomically (:mod:`hybriddp.core.atomic`): it is never half-written; a new file is
        made 0600 (what rounds a device reported in is its owner's business)."""
        new = not os.path.exists(self.path)
        # pragma (mutation testing, docs/TESTING.md): every number in the state was checked finite on its way in
        # (_new_ledger_state, _parse_ledger, check), so allow_nan=False is a guard no input reaches
        write_text(self.path, json.dumps(self.state, allow_nan=False))  # pragma: no mutate
        if new:
            with contextlib.suppress(OSError):  # a file system without modes: the charge stands all the same
                os.chmod(self.path, 0o600)


@contextlib.contextmanager
def _ledger_lock(path: str) -> Iterator[None]:
    """An exclusive advisory lock (``flock``) on the directory of the ledger file ``path``, held for one charge.

    The directory, not the file, is locked because the file is replaced by a rename at every charge. Where
    ``flock`` does not exist (Windows) or the file system refuses it, charges are not serialized.
    """
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:  # no such directory: the save names the problem
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# ----- the default device ledger ------------------------------------------------------------------
DEVICE_LIFETIME_EPSILON = 16.0
"""Lifetime ε of a new default device ledger (the browser page's budget too)."""
DEVICE_LIFETIME_DELTA = 1e-4
"""Lifetime δ of a new default device ledger."""
DEVICE_LEDGER_NAME = "device-ledger.json"
"""The device ledger's file name in :func:`data_home`."""


def data_home() -> Path:
    """hybriddp's per-user data directory: ``$HYBRIDDP_DATA_HOME`` if set; else ``$XDG_DATA_HOME/hybriddp``
    (an absolute ``XDG_DATA_HOME`` only, as the XDG specification says); else the platform's place:
    ``%LOCALAPPDATA%\\hybriddp`` on Windows, ``~/Library/Application Support/hybriddp`` on macOS,
    ``~/.local/share/hybriddp`` elsewhere. Nothing is created here."""
    env = os.environ.get("HYBRIDDP_DATA_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "hybriddp"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "hybriddp"
    try:
        home = Path.home()
    except RuntimeError:  # no HOME and no password entry
        raise DeviceError("cannot find this user's home directory for hybriddp's data (the device ledger); set "
                          "HYBRIDDP_DATA_HOME to a private directory") from None
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "hybriddp"
    return home / ".local" / "share" / "hybriddp"


def default_device_ledger_path() -> Path:
    """Where a device keeps its ledger unless told otherwise: ``device-ledger.json`` in :func:`data_home`.

    ``hybriddp participate`` and :class:`hybriddp.sdk.client.DeviceClient` both use it by default.
    """
    return data_home() / DEVICE_LEDGER_NAME


def open_device_ledger(path: str | os.PathLike[str] | None = None, *, lifetime_epsilon: float | None = None,
                       lifetime_delta: float | None = None, accountant: Accountant | None = None) -> DeviceLedger:
    """The device ledger at ``path``, by default :func:`default_device_ledger_path` (its directory created
    with mode 0700 if missing). A new ledger gets the lifetime budget given, else
    (:data:`DEVICE_LIFETIME_EPSILON`, :data:`DEVICE_LIFETIME_DELTA`); an existing one keeps its own.
    ``accountant``: the tighter accountant (the SDK and the CLI pass :func:`hybriddp.audit.pld.device_accountant`)."""
    if path is None:
        path = default_device_ledger_path()
        try:
            os.makedirs(path.parent, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise DeviceError(f"cannot create hybriddp's data directory {path.parent} for the device ledger "
                              f"({exc.strerror or exc}); set HYBRIDDP_DATA_HOME to a writable private directory, "
                              "or give the ledger's path (--device-ledger)") from None
    return DeviceLedger(path, lifetime_epsilon=lifetime_epsilon, lifetime_delta=lifetime_delta,
                        default_lifetime=(DEVICE_LIFETIME_EPSILON, DEVICE_LIFETIME_DELTA), accountant=accountant)


_LEDGER_FIX = ("Restore it from a backup; do not delete it, since a new ledger would forget the budget this "
               "device has already spent.")


def _checked_shape(shape: dict[str, Any], path: str) -> dict[str, Any]:
    """A head list's shape as the ledger keeps it, checked: ``kq`` positive integers, ``f_c`` in (0, 1],
    ``m_c`` >= 1."""
    try:
        kq = [int(x) for x in shape["kq"]]
        f_c, m_c = float(shape["f_c"]), int(shape["m_c"])
    except (KeyError, TypeError, ValueError):
        raise DeviceError(f"device ledger {path}: a round's shape must be {{'kq': [...], 'f_c': f, 'm_c': m}}, "
                          f"got {_show(shape, 60)}") from None
    if not kq or min(kq) < 1 or not 0 < f_c <= 1 or m_c < 1:
        raise DeviceError(f"device ledger {path}: a round's shape has kq {kq[:5]}…, f_c {f_c}, m_c {m_c}: "
                          "kq must be integers >= 1, f_c in (0, 1], m_c >= 1")
    return {"kq": kq, "f_c": f_c, "m_c": m_c}


def records_key(records: Any) -> str:
    """A key of a device's records as a multiset (SHA-256 of their sorted canonical JSON): the memo is reused
    only for the same records. The records themselves are never stored in the ledger."""
    rows = sorted(json.dumps([q, u], ensure_ascii=False) for q, u in records)
    return hashlib.sha256("\n".join(rows).encode("utf-8", "surrogatepass")).hexdigest()


def _new_ledger_state(path: str, epsilon: float | None, delta: float | None) -> dict[str, Any]:
    """The state of a new device ledger with lifetime budget (ε, δ), checked."""
    if epsilon is None or delta is None:
        raise DeviceError(f"device ledger {path} does not exist; to create it give the device's lifetime budget "
                          "(--lifetime-epsilon and --lifetime-delta)")
    _check_number("lifetime epsilon (--lifetime-epsilon)", epsilon, "a finite number > 0",
                  lambda x: 0 < x < math.inf, "")
    _check_number("lifetime delta (--lifetime-delta)", delta, "a number in (0, 1)", lambda x: 0 < x < 1, "")
    return {"lifetime": {"epsilon": float(epsilon), "delta": float(delta)}, "rounds": {}}


def _parse_ledger(data: bytes, path: str) -> dict[str, Any]:
    """Parse and check a device ledger file's bytes; raise :class:`DeviceError` saying what is wrong."""
    where = f"device ledger {path}"
    if not data.strip():
        raise DeviceError(f"{where} is empty. hybriddp writes it atomically, so it was never left empty by a "
                          f"report: something else truncated it. {_LEDGER_FIX}")
    try:
        state = json.loads(data.decode())  # UTF-8
    except UnicodeDecodeError as exc:
        raise DeviceError(f"{where} is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}), so it is "
                          f"damaged or not a device ledger. {_LEDGER_FIX}") from None
    except (ValueError, RecursionError) as exc:
        raise DeviceError(f"{where} is not valid JSON ({exc}), so it is damaged or not a device ledger. "
                          f"{_LEDGER_FIX}") from None
    shape = '{"lifetime": {"epsilon": E, "delta": D}, "rounds": {...}}'
    if not isinstance(state, dict) or not isinstance(state.get("lifetime"), dict) \
            or not isinstance(state.get("rounds"), dict):
        found = (f"{_kind(state)} {_show(state, 40)}" if not isinstance(state, dict) else
                 f"an object with {', '.join(_show(k, 20) for k in list(state)[:5]) or 'no fields'}")
        raise DeviceError(f"{where}: expected a JSON object {shape}, found {found}; it is damaged or not a "
                          f"device ledger. {_LEDGER_FIX}")
    life = state["lifetime"]
    for name, allowed, ok in (("epsilon", "a finite number > 0", lambda x: 0 < x < math.inf),
                              ("delta", "a number in (0, 1)", lambda x: 0 < x < 1)):
        if name not in life:
            raise DeviceError(f"{where}: field 'lifetime' has no {name!r}. {_LEDGER_FIX}")
        _check_number(f"{where}: field lifetime.{name}", life[name], allowed, ok, _LEDGER_FIX)
    for key, charge in state["rounds"].items():
        if not isinstance(charge, dict) or "epsilon" not in charge or "delta" not in charge:
            raise DeviceError(f"{where}: round {_show(key, 30)} = {_show(charge, 40)}; it must be an object "
                              f'{{"epsilon": e, "delta": d}}. {_LEDGER_FIX}')
        _check_number(f"{where}: rounds[{_show(key, 30)}].epsilon", charge["epsilon"], "a finite number >= 0",
                      lambda x: 0 <= x < math.inf, _LEDGER_FIX)
        _check_number(f"{where}: rounds[{_show(key, 30)}].delta", charge["delta"], "a number in [0, 1]",
                      lambda x: 0 <= x <= 1, _LEDGER_FIX)
        if "shape" in charge:
            charge["shape"] = _checked_shape(charge["shape"], path)
    return state

