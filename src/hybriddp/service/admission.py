"""Who may get report tokens (docs/TOKENS.md): a small pluggable interface, with device credentials built in.

An :class:`Admission` decides, from the issuance request's bearer credential, whether the caller is admitted
and under which *holder* key its tokens are counted (each holder gets at most ``tokens_per_round`` tokens per
round, counted by :meth:`hybriddp.service.store.Store.charge_tokens`). A deployment that trusts accounts or
device attestation writes its own (a few lines) and passes it to ``create_app(admission=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hybriddp.service.store import Store


@dataclass(frozen=True)
class Admitted:
    """An admitted caller: its tokens are counted under ``holder``, at most ``tokens_per_round`` per round."""

    holder: str
    tokens_per_round: int


class Admission(Protocol):
    """Decides who may get report tokens. ``admit`` raises
    :class:`~hybriddp.service.errors.UnauthorizedError` for a caller it does not admit; it runs in a thread."""

    name: str

    def admit(self, store: Store, credential: str | None) -> Admitted: ...


class CredentialAdmission:
    """Admin-issued device credentials (``hybriddp credentials create``), each its own holder."""

    name = "device-credentials"

    def admit(self, store: Store, credential: str | None) -> Admitted:
        cred = store.credential(credential)
        return Admitted(f"credential:{cred.id}", cred.tokens_per_round)
