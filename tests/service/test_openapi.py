"""schemathesis against the service's own ``/openapi.json`` (issue 10): no 5xx, every response as documented.

The ASGI app runs in-process on a fresh database (``store_url``: SQLite and PostgreSQL) that already
holds rounds in every interesting state, so generated requests reach real rounds, not only 404s:
a generated ``round_id`` is swapped for one of them in most cases, and most requests carry the
administrator token. Generation is derandomized with a bounded number of examples, so the test
is deterministic and takes seconds.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from hybriddp.device.localalg import randomize_records
from hybriddp.service import create_app
from tokenhelpers import relay_credential, tokened

ADMIN = "schemathesis-admin-token-0123456789"
API = "/api/v1"
EXAMPLES = 15  # per operation and mode: ~15 operations x 2 modes x 2 databases
schemathesis.serializer.alias("message/ohttp-req", "application/octet-stream")  # POST /ohttp's opaque bytes
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]


def _optin(client: TestClient, rid: str, users: int, seed: int) -> None:
    rng = random.Random(seed)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    tokens = client.post(f"{API}/rounds/{rid}/optin/enrol", headers=admin,
                         json={"users": [f"u{i}" for i in range(users)]}).json()["tokens"]
    for token in tokens:
        q = min(int(rng.expovariate(0.7)), 4)
        r = client.post(f"{API}/rounds/{rid}/optin/records", headers={"Authorization": f"Bearer {token}"},
                        json={"records": [{"query": f"q{q}", "url": f"https://s{q}.example/{rng.randint(0, 1)}"}]})
        assert r.status_code == 200, r.text


def seed_rounds(client: TestClient) -> dict[str, str]:
    """Rounds in each state: collecting-optin, headlist-published, collecting-reports, results-published, mean."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    ids: dict[str, str] = {}
    params = {"epsilon": 4.0, "delta": 1e-5, "head_list_size": 8}
    for state in ("collecting-optin", "headlist-published", "collecting-reports", "results-published"):
        r = client.post(f"{API}/rounds", headers=admin, json={"kind": "blender", "name": state, "params": params})
        assert r.status_code == 201, r.text
        rid = ids[state] = r.json()["id"]
        _optin(client, rid, 60, seed=len(ids))
        if state == "collecting-optin":
            continue
        assert client.post(f"{API}/rounds/{rid}/headlist", headers=admin).status_code == 200
        if state == "headlist-published":
            continue
        doc = client.get(f"{API}/rounds/{rid}/headlist").json()
        records = [(q["query"], u) for q in doc["queries"] for u in q["urls"]]
        msgs = tokened(client, API, rid, relay_credential(client, API, admin, 200),
                       [randomize_records(doc, [records[i % len(records)]]) for i in range(200)])
        assert client.post(f"{API}/rounds/{rid}/reports", json=msgs).status_code == 200
        if state == "results-published":
            resp = client.post(f"{API}/rounds/{rid}/close", headers=admin, json={"flagged": "publish"})
            assert resp.status_code == 200
    r = client.post(f"{API}/rounds", headers=admin, json={"kind": "mean", "params": {"epsilon": 1.0, "lower": 0,
                                                                                       "upper": 10}})
    assert r.status_code == 201, r.text
    ids["mean"] = r.json()["id"]
    return ids


@pytest.fixture
def service(store_url: str) -> Iterator[tuple[Any, dict[str, str]]]:
    app = create_app(store_url, ADMIN)  # admission on, the default: reports need tokens
    try:
        yield app, seed_rounds(TestClient(app))  # no `with`: the lifespan would close the store
    finally:
        app.state.writer.close()
        app.state.store.close()


def operations(app: Any) -> list[Any]:
    """Every operation of the app's served /openapi.json."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    return [result.ok() for result in schema.get_all_operations()]


def exercise(case: Any, ids: list[str]) -> None:
    """Point most cases at a real round and give most the admin token; call; run the checks."""
    key = zlib.crc32(repr((case.method, case.path, case.path_parameters, case.query, case.body)).encode())
    if case.path_parameters and "round_id" in case.path_parameters and key % 5:
        case.path_parameters["round_id"] = ids[key % len(ids)]
    headers = dict(case.headers or {})
    if key % 3:
        headers["Authorization"] = f"Bearer {ADMIN}"
    case.headers = headers
    case.call_and_validate(checks=CHECKS)


def test_every_response_is_documented_and_no_request_gets_a_5xx(service: tuple[Any, dict[str, str]]) -> None:
    app, rounds = service
    ids = sorted(rounds.values())
    ops = operations(app)
    assert len(ops) >= 14, [op.label for op in ops]
    failures = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):  # valid requests, then invalid ones
        for op in ops:
            @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                exercise(case, ids)

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body): GET /health, /metrics
                assert mode is GenerationMode.NEGATIVE and not op.path_parameters and not op.body, op.label
            except Exception as exc:  # collect every operation's first failure, then report them together
                failures.append(f"{mode.value} {op.label}: {exc}")
    assert not failures, "\n\n".join(failures)
