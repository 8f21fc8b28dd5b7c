"""Report tokens (docs/TOKENS.md): a round's token key, blind issuance to admitted devices, device credentials.

* ``GET /api/v1/rounds/{id}/token-key``: the round's public key, key id and challenge (anyone).
* ``POST /api/v1/rounds/{id}/tokens``: blind signatures for an admitted device (``Authorization: Bearer
  <device credential>``), counted against its tokens per round. Only the count is stored.
* ``/api/v1/device-credentials``: the administrator makes, lists and revokes credentials; with
  ``--self-enrolment`` (demos) ``POST /api/v1/device-credentials/self`` gives one to any same-origin caller.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hybriddp.core import tokens
from hybriddp.core.errors import DataError
from hybriddp.service import models as m
from hybriddp.service.errors import NotFoundError
from hybriddp.service.routers.common import ADMIN, RoundId, Service, StoreDep, errors
from hybriddp.service.store import Store

router = APIRouter(tags=["tokens"])

device_bearer = HTTPBearer(auto_error=False, scheme_name="DeviceCredential",
                           description="A device credential (`hybriddp credentials create`).")
DeviceCredentials = Annotated[HTTPAuthorizationCredentials | None, Security(device_bearer)]


@router.get("/api/v1/rounds/{round_id}/token-key", response_model=m.TokenKeyOut, responses=errors(404, 409, 503))
def get_token_key(round_id: RoundId, service: Service) -> dict[str, Any]:
    _, key, _ = service.store.round_key(round_id)
    return {**key.to_dict(), "admission": "open" if service.admission is None else "tokens"}


@router.post("/api/v1/rounds/{round_id}/tokens", response_model=m.TokenSigsOut,
             responses=errors(400, 401, 403, 404, 409, 415, 422, 503))
def issue_tokens(round_id: RoundId, body: m.TokensIn, creds: DeviceCredentials, service: Service) -> dict[str, Any]:
    """Blind-sign the device's token requests: one per message it will send (RFC 9474 §4.3)."""
    admission = service.admission
    if admission is None:
        raise DataError("this server runs with --open-admission and takes reports without tokens; send the report "
                        "without one")
    admitted = admission.admit(service.store, None if creds is None else creds.credentials)
    info, key, private = service.store.round_key(round_id, private=True)
    assert private is not None
    fields = [f"blinded_msgs[{i}]" for i in range(len(body.blinded_msgs))]
    # every message is checked before any is counted, and counted before any is signed
    raws = [tokens.blinded_input(private, b, f) for b, f in zip(body.blinded_msgs, fields, strict=True)]
    remaining = service.store.charge_tokens(admitted.holder, admitted.tokens_per_round, info, len(raws))
    sigs = [tokens.sign_blinded(private, r, f) for r, f in zip(raws, fields, strict=True)]
    return {"blind_sigs": sigs, "key_id": tokens.b64(key.key_id), "remaining": remaining}


@router.post("/api/v1/device-credentials", status_code=201, response_model=m.NewCredentialsOut, dependencies=ADMIN,
             responses=errors(400, 401, 422, 503))
def create_credentials(body: m.CredentialsIn, store: StoreDep) -> dict[str, Any]:
    return {"credentials": _made(store, body.count, body.tokens_per_round, body.label)}


@router.get("/api/v1/device-credentials", response_model=m.CredentialListOut, dependencies=ADMIN,
            responses=errors(401, 503))
def list_credentials(store: StoreDep) -> dict[str, Any]:
    return {"credentials": [c.to_json() for c in store.credentials()]}


@router.delete("/api/v1/device-credentials/{cred_id}", response_model=m.CredentialOut, dependencies=ADMIN,
               responses=errors(401, 404, 503))
def revoke_credential(cred_id: Annotated[int, Path(ge=1, le=2**62)], store: StoreDep) -> dict[str, Any]:
    return store.revoke_credential(cred_id).to_json()


@router.post("/api/v1/device-credentials/self", status_code=201, response_model=m.NewCredentialOut,
             responses=errors(404, 503))
async def self_enrol(service: Service) -> dict[str, Any]:
    """A credential for any caller (one token per round): only on a server started with --self-enrolment (demos)."""
    if not service.self_enrolment:
        raise NotFoundError("self-enrolment is off on this server: ask its administrator for a device credential")
    (made,) = await run_in_threadpool(_made, service.store, 1, 1, "self-enrolled")
    return made


def _made(store: Store, count: int, per_round: int, label: str | None) -> list[dict[str, Any]]:
    return [{**cred.to_json(), "credential": secret} for cred, secret in store.create_credentials(count, per_round,
                                                                                                   label)]
