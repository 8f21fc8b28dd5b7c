"""Report tokens from a running service, for the tests of the service and of the pages (docs/TOKENS.md).

:func:`relay_credential` and :func:`tokened` get real tokens through the API (any client with ``get``/``post``: a
Starlette ``TestClient`` or an ``httpx.Client``); :func:`stream` replays given random bytes (as the JS tests'
injected getRandomValues does). The JavaScript client's fixtures are :mod:`jstokenhelpers`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybriddp.core import tokens


def stream(data: bytes) -> Callable[[int], bytes]:
    """An rng that hands out ``data`` in order (as the JS test's injected getRandomValues does)."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        assert pos + n <= len(data), "the replayed random bytes are used up"
        pos += n
        return data[pos - n:pos]

    return take


def relay_credential(http: Any, api: str, admin: dict[str, str], tokens_per_round: int) -> str:
    """A new device credential with ``tokens_per_round`` tokens a round (a relay's), made by the administrator."""
    r = http.post(f"{api}/device-credentials", headers=admin,
                  json={"tokens_per_round": tokens_per_round, "label": "tests: relay"})
    assert r.status_code == 201, r.text
    return str(r.json()["credentials"][0]["credential"])


def tokened(http: Any, api: str, rid: str, credential: str, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages, each with a report token got with ``credential`` through the API and the id its nonce derives
    (protocol v2, docs/TOKENS.md; the key is checked against the head list's commitment)."""
    r = http.get(f"{api}/rounds/{rid}/token-key")
    assert r.status_code == 200, r.text
    committed = http.get(f"{api}/rounds/{rid}/headlist").json().get("token_key")
    assert committed is not None, "the round's head list commits to no token key"
    key = tokens.RoundKey.from_dict(r.json(), rid, committed)
    reqs = [tokens.TokenRequest.make(key) for _ in msgs]
    r = http.post(f"{api}/rounds/{rid}/tokens", headers={"Authorization": f"Bearer {credential}"},
                  json={"blinded_msgs": [q.blinded for q in reqs]})
    assert r.status_code == 200, r.text
    return [tokens.spend(m, q.finalize(sig)) for m, q, sig in zip(msgs, reqs, r.json()["blind_sigs"], strict=True)]
