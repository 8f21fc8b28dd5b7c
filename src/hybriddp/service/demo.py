"""The demo through the collection service: one BLENDER round over HTTP on a local server.

:func:`service_round` plays every party of paper Fig. 1 against a running server with the SDK
(:mod:`hybriddp.sdk.client`): the operator creates the round and enrols the opt-in users, each opt-in
user uploads their raw records, the server builds and publishes the head list, every client
device randomizes its records (the device randomizer, :func:`hybriddp.device.party.log_messages`)
and the messages are submitted in batches, the operator closes the round, and the result is
fetched. :func:`service_demo` does that on a temporary SQLite database behind a server started on
127.0.0.1 (:func:`local_server`); ``hybriddp demo --service`` and ``hybriddp serve --demo`` call it.

``hybriddp serve --demo`` (:func:`populate_demo`) then leaves a second round of the same population
open for reports (:func:`collecting_round`: head list published, no device report yet), so the
local-search page can search the finished round and contribute to the open one.

Reproducing a seeded simulation. With a seed the round is created as an *experiment* (no privacy):
the opt-in users are :func:`hybriddp.simulation.pipeline.split_optin`'s, enrolled in the simulation's order,
each uploading their records in log order; the head-list build gets the seed and the order of the
vocabulary codes (CreateHeadList draws one noise value per distinct record in code order), and the
devices replay the batch randomizer's draws (``log_messages(..., seed=seed)``). The server then
computes exactly what ``hybriddp demo --seed`` computes.

Scoring. The server knows no truth. The demo rebuilds the server's result from the published
release (head list, opt-in estimates, report counts: :func:`hybriddp.server.party.serve_estimates`),
checks it equals the result the server published, and scores it against the distribution of the
records the parties sampled (ALGORITHM.md §9): with a seed the simulation replays the curator's and
the devices' sampling; without one the parties' samples are secret and a fresh sample stands in.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from hybriddp.core.errors import DataError, HybridDPError
from hybriddp.core.headlist import HeadList
from hybriddp.core.noise import noise_factory
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import NO_URL, RecordLog, SampledRecords, sample_records
from hybriddp.core.rng import stage_rng
from hybriddp.core.stages import Stages
from hybriddp.curator.party import curator_side
from hybriddp.curator.release import release_from_documents
from hybriddp.device.party import log_messages, sample_clients
from hybriddp.sdk.client import Acknowledgement, AdminClient, DeviceClient, OptinRelay
from hybriddp.sdk.http import RetryPolicy, new_client
from hybriddp.server.party import serve_estimates
from hybriddp.server.result import Result
from hybriddp.simulation.evaluate import ground_truth, score, truth_vectors
from hybriddp.simulation.pipeline import split_optin

RUN_SIZES = ("users", "records", "optin_users", "optin_users_s", "optin_users_t", "clients", "records_s",
             "records_t", "reports", "head_list_s_records", "head_list_s_queries")
"""The sizes of a simulated run (:func:`hybriddp.simulation.pipeline.result_from_run`), in its order."""

MESSAGES_PER_REQUEST = 20_000
"""Device messages per batched submission (NDJSON)."""

DEMO_TIMEOUT_S = 900.0
"""Seconds each of the demo's clients waits for an answer (its connection: :data:`DEMO_CONNECT_S`): on a busy
machine an upload, a build or a close takes longer, and the demo is delayed, not stopped."""
DEMO_CONNECT_S = 30.0
DEMO_RETRY = RetryPolicy(attempts=8, base_delay=1.0, max_delay=30.0)
"""Retries of the demo's requests after a timeout, a dropped connection, 429 or 5xx (idempotent requests and the
opt-in relay's uploads, :class:`DemoOptinRelay`): up to seven, backing off to 30 s, a few minutes in all."""


def demo_http() -> httpx.Client:
    """The connection pool of the demo's opt-in relay and devices, with the demo's long timeouts."""
    return new_client(httpx.Timeout(DEMO_TIMEOUT_S, connect=DEMO_CONNECT_S))


def demo_admin(base_url: str, admin_token: str) -> AdminClient:
    """The demo operator's client, with the demo's long timeouts and retries."""
    return AdminClient(base_url, admin_token, timeout=DEMO_TIMEOUT_S, retry=DEMO_RETRY)


class DemoOptinRelay(OptinRelay):
    """The demo's opt-in relay: every NDJSON body is retried as an idempotent request (:data:`DEMO_RETRY`).

    Safe: the server keys each user's upload by its content and stores a body whole or not at all
    (:mod:`hybriddp.service.routers.optin`), so a body stored before its answer was lost comes back as duplicates,
    stored once, and a body refused whole (503 from a loaded server) is stored by the retry."""

    def request_json(self, method: str, path: str, *, what: str, idempotent: bool, **kw: Any) -> Any:
        """:meth:`ServiceHttp.request_json`, always with retries (``idempotent`` is overridden: class docstring)."""
        return super().request_json(method, path, what=what, idempotent=True, **kw)


# ----- a server on 127.0.0.1 ----------------------------------------------------------------
@contextlib.contextmanager
def local_server(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve an ASGI app with Uvicorn in a background thread on a free port; yields its base URL.

    The socket is bound (and listening) before the thread starts, so the URL works as soon as it is
    yielded: connections wait in the backlog until Uvicorn accepts them. The server is stopped on exit.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit TCP_NODELAY (asyncio sets it when it binds itself); without it every
    # response waits ~40 ms for the client's delayed ACK (Nagle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    sock.listen(2048)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="auto",
                                           http="hybriddp.service.http:Protocol"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="hybriddp-local-server",
                              daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


# ----- one round through the service ----------------------------------------------------------
@dataclass
class ServiceRound:
    """What the demo round produced."""

    result: Result  # the server's result, scored against the truth (as `hybriddp demo` shows it)
    round: dict[str, Any]  # the server's Round JSON after close
    server_results: dict[str, Any]  # the result JSON the server published
    reports: Acknowledgement  # what the server answered to the device submissions
    base_url: str
    optin_users: np.ndarray  # the round's opt-in users (indices into the log)
    collecting: dict[str, Any] | None = None  # serve --demo: the Round JSON of the round left collecting reports


def round_params(params: BlenderParams, noise: str) -> dict[str, Any]:
    """A round's ``params`` object for ``POST /api/v1/rounds``."""
    return {"epsilon": params.epsilon, "delta": params.delta, "head_list_size": params.head_list_size,
            "m_o": params.m_o, "m_c": params.m_c, "f_o": params.f_o, "f_c": params.f_c, "noise": noise,
            "project": params.project, "estimator": params.estimator, "optin_fraction": params.optin_fraction}


def _optin_vocabulary(log: RecordLog, rows: np.ndarray) -> dict[str, list[str]]:
    """The opt-in records' strings in the order of the log's integer codes (seeded experiments only)."""
    q = np.unique(log.query[rows])
    u = np.unique(log.url[rows])
    return {"queries": log.queries.decode(q), "urls": log.urls.decode(u[u != NO_URL])}


def _user_rows(log: RecordLog, users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the given users (in their order) and the CSR offsets into them."""
    off = log.user_offsets
    counts = off[users + 1] - off[users]
    starts = np.repeat(off[users] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    rows = np.arange(int(counts.sum()), dtype=np.int64) + starts
    return rows, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _records(log: RecordLog, rows: np.ndarray) -> list[tuple[str, str | None]]:
    queries = log.queries.decode(log.query[rows])
    if not log.has_urls:
        return [(q, None) for q in queries]
    url_ids = log.url[rows]
    urls = log.urls.decode(np.where(url_ids == NO_URL, 0, url_ids)) if len(log.urls) else [""] * len(rows)
    return [(q, None if uid == NO_URL else u) for q, u, uid in zip(queries, urls, url_ids.tolist(), strict=True)]


def publish_headlist_round(admin: AdminClient, http: httpx.Client, log: RecordLog, params: BlenderParams,
                           optin_users: np.ndarray, *, seed: int | None, noise: str, name: str,
                           stages: Stages, which: str = "") -> str:
    """Create a BLENDER round, enrol ``optin_users``, let each upload their records and have the server
    publish the head list (the round then takes device reports); returns the round's id. ``which`` ends
    the stages' names."""
    with stages.stage("create the round and enrol the opt-in users" + which):
        rnd = admin.create_round("blender", round_params(params, noise), name=name, seed=seed)
        rid = rnd["id"]
        tokens = admin.enrol_many(rid, log.user_keys(optin_users))
    with stages.stage("opt-in users upload their records" + which):
        rows, bounds = _user_rows(log, optin_users)
        records = _records(log, rows)
        uploads = ((token, records[bounds[i]:bounds[i + 1]]) for i, token in enumerate(tokens)
                   if bounds[i + 1] > bounds[i])
        # each user's line carries their token; retried on a busy machine (DemoOptinRelay)
        DemoOptinRelay(admin.base_url, rid, client=http, retry=DEMO_RETRY).upload_many(uploads)
        del records
    with stages.stage("the server builds and publishes the head list" + which):
        admin.publish_headlist(rid, vocabulary=_optin_vocabulary(log, rows) if seed is not None else None)
    return str(rid)


def service_round(log: RecordLog, params: BlenderParams, *, base_url: str, admin_token: str, seed: int | None,
                  noise: str = "discrete", name: str = "demo", stages: Stages | None = None) -> ServiceRound:
    """Run one BLENDER round of the simulated population ``log`` through the server at ``base_url``."""
    stages = stages or Stages()
    with stages.stage("assign opt-in users"):
        optin_users, client_users = split_optin(log.n_users, params.optin_fraction, seed)
    with contextlib.ExitStack() as stack:
        admin = stack.enter_context(demo_admin(base_url, admin_token))
        http = stack.enter_context(demo_http())
        rid = publish_headlist_round(admin, http, log, params, optin_users, seed=seed, noise=noise, name=name,
                                     stages=stages)
        with stages.stage("devices randomize and submit their reports"):
            # a simulation of every client device from one process: the messages are prepared by log_messages and
            # sent as they are, so no device ledger of this machine's user may be charged for them
            device = DeviceClient(base_url, rid, DeviceClient.NO_LEDGER, client=http, retry=DEMO_RETRY)
            headlist = device.fetch_headlist()
            ack = device.submit_batch(log_messages(log, client_users, headlist, seed=seed),
                                      chunk=MESSAGES_PER_REQUEST)
        with stages.stage("close the round and estimate"):
            closed = admin.close(rid, "publish")  # a simulated, honest round
            server_results = admin.results(rid)
            release = admin.release(rid)
        with stages.stage("score against the truth"):
            res = scored_result(log, params, release, optin_users, client_users, seed=seed, noise=noise)
            check_same_estimates(res, server_results)
    return ServiceRound(res, closed, server_results, ack, base_url, optin_users)


def collecting_round(log: RecordLog, params: BlenderParams, exclude: np.ndarray, *, base_url: str,
                     admin_token: str, seed: int | None, noise: str = "discrete", name: str,
                     stages: Stages | None = None) -> dict[str, Any]:
    """A second BLENDER round of ``log`` left open for device reports (its head list published); returns its
    Round JSON.

    Its opt-in users are as many as a round's (``optin_fraction`` of the users), drawn from the users not in
    ``exclude`` (the first round's opt-in users), so one ``serve --demo`` charges no user's lifetime budget
    twice; the head list is built from their records with the same parameters.
    """
    stages = stages or Stages()
    with stages.stage("assign the second round's opt-in users"):
        others = np.setdiff1d(np.arange(log.n_users, dtype=np.int64), exclude)
        n = min(round(params.optin_fraction * log.n_users), len(others))
        optin_users = np.sort(stage_rng(seed, "demo_collecting").choice(others, size=n, replace=False))
    with demo_admin(base_url, admin_token) as admin, demo_http() as http:
        rid = publish_headlist_round(admin, http, log, params, optin_users, seed=seed, noise=noise, name=name,
                                     stages=stages, which=" (second round)")
        return admin.round(rid)


def scored_result(log: RecordLog, params: BlenderParams, release: dict[str, Any], optin_users: np.ndarray,
                  client_users: np.ndarray, *, seed: int | None, noise: str) -> Result:
    """The server's result rebuilt from its release, named in the log's vocabulary, with truth and metrics
    as :func:`hybriddp.simulation.pipeline.result_from_run` computes them."""
    rel = release_from_documents(release["headlist"], release["estimates"], headlist_source="the round's head list",
                                 estimates_source="the round's opt-in estimates")
    counts = np.asarray(release["counts"], dtype=np.int64)
    server = serve_estimates(rel, counts)
    hl = _in_log_codes(release["headlist"], log)
    n_optin = len(optin_users)
    parts = _sampled_parts(log, params, optin_users, client_users, seed=seed, noise=noise)
    sizes = {**server.sizes, "users": log.n_users, "records": log.n_records, "clients": log.n_users - n_optin}
    # the demo's own seed: the service never publishes a round's seed (its estimates carry seed null)
    res = Result.blender(server.params, hl, log.queries, log.urls, server.parts, {k: sizes[k] for k in RUN_SIZES},
                         seed, server.url_level)
    truth, held = ground_truth(log, parts)
    res.truth_query, res.truth_record = truth_vectors(hl, truth)
    res.metrics = score(hl, res.blended.records_final, res.blended.queries_final, truth, log, held,
                        res.blended.queries_rank)
    return res


def _in_log_codes(headlist: dict[str, Any], log: RecordLog) -> HeadList:
    """The published head list coded in the log's vocabularies (to score it against the log)."""
    names = [q["query"] for q in headlist["queries"]]
    qids = log.queries.encode(names)
    urls = [log.urls.encode(q["urls"]) if q["urls"] else np.zeros(0, dtype=np.int64) for q in headlist["queries"]]
    if (qids < 0).any() or any((u < 0).any() for u in urls):
        raise DataError("the server's head list names a query or URL the demo's log does not have; the round "
                        "was not built from this log")
    return HeadList.from_lists(qids.tolist(), [u.tolist() for u in urls])


def _sampled_parts(log: RecordLog, params: BlenderParams, optin_users: np.ndarray, client_users: np.ndarray, *,
                   seed: int | None, noise: str) -> tuple[SampledRecords, ...]:
    """The records the parties sampled: replayed with a seed (the simulation's own streams), else a fresh sample."""
    if seed is not None:
        cur = curator_side(log, optin_users, params, seed=seed, noise_factory=noise_factory(noise))
        return cur.sampled_s, cur.sampled_t, sample_clients(log, client_users, params.m_c, seed)
    rng = np.random.default_rng()
    return (sample_records(log, optin_users, params.m_o, rng), sample_records(log, client_users, params.m_c, rng))


def check_same_estimates(res: Result, server_results: dict[str, Any]) -> None:
    """The result rebuilt from the release must be the one the server published (else a bug)."""
    mine = res.to_json()
    for table in ("records", "queries"):
        theirs = server_results.get(table)
        ours = [{k: v for k, v in row.items() if k != "p_true"} for row in mine[table]]
        if not isinstance(theirs, list) or len(theirs) != len(ours) or any(
                not _same_row(a, b) for a, b in zip(ours, theirs, strict=True)):
            raise HybridDPError(f"the server's published {table} differ from the result its release gives; this is "
                                "a bug, please report it")


def _same_row(a: dict[str, Any], b: Any) -> bool:
    if not isinstance(b, dict) or set(a) != set(b):
        return False
    for k, v in a.items():
        w = b[k]
        if isinstance(v, float) and isinstance(w, (int, float)):
            if not (v == w or math.isclose(v, w, rel_tol=1e-12, abs_tol=1e-300)):
                return False
        elif v != w:
            return False
    return True


# ----- on a temporary database ------------------------------------------------------------------
def service_demo(log: RecordLog, params: BlenderParams, *, seed: int | None, noise: str = "discrete",
                 db_url: str | None = None, stages: Stages | None = None, name: str = "demo",
                 lifetime_epsilon: float | None = None, lifetime_delta: float | None = None,
                 collecting_name: str | None = None) -> ServiceRound:
    """Start a server on 127.0.0.1 (a temporary SQLite database unless ``db_url``) and run :func:`service_round`;
    with ``collecting_name``, then also :func:`collecting_round` under that name."""
    from hybriddp.service import create_app

    stages = stages or Stages()
    token = secrets.token_urlsafe(32)
    with contextlib.ExitStack() as stack:
        if db_url is None:  # in memory (tmpfs) where there is one: a temporary database needs no fsync to disk
            shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="hybriddp-demo-", dir=shm))
            db_url = "sqlite:///" + os.path.join(tmp, "hybriddp.db")
        with stages.stage("start the service"):
            kw: dict[str, Any] = {}
            if lifetime_epsilon is not None:
                kw["lifetime_epsilon"] = lifetime_epsilon
            if lifetime_delta is not None:
                kw["lifetime_delta"] = lifetime_delta
            # a seeded demo reproduces `hybriddp demo --seed` (an experiment, no privacy): only then are seeds taken
            # open admission on this temporary server only: the simulated population's devices are the demo's own
            # (a token each would add ~2 ms per device and change nothing measured); `serve` needs tokens
            app = create_app(db_url, admin_token=token, max_body_bytes=1 << 30, allow_seeds=seed is not None,
                             optin_max_records=1 << 30, optin_max_bytes=1 << 40, open_admission=True, **kw)
            base_url = stack.enter_context(local_server(app))
        done = service_round(log, params, base_url=base_url, admin_token=token, seed=seed, noise=noise,
                             name=name, stages=stages)
        if collecting_name is not None:
            done.collecting = collecting_round(log, params, done.optin_users, base_url=base_url, admin_token=token,
                                               seed=seed, noise=noise, name=collecting_name, stages=stages)
        return done


def populate_demo(db_url: str, *, preset: str = "aol", scale: float = 0.1, seed: int | None = None,
                  lifetime_epsilon: float | None = None, lifetime_delta: float | None = None,
                  stages: Stages | None = None) -> ServiceRound:
    """``hybriddp serve --demo``: run a demo round (paper defaults, OS randomness unless ``seed``) into the
    database at ``db_url`` through a temporary server; the round stays there, results published, next to a
    second round of the same population left collecting reports (:func:`collecting_round`)."""
    from hybriddp.datasets.synth import generate

    stages = stages or Stages()
    params = BlenderParams.paper_defaults(preset)
    with stages.stage(f"generating the {preset} preset"):
        log = generate(preset, seed=seed, scale=scale)
    name = f"demo ({preset} preset, scale {scale:g})"
    return service_demo(log, params, seed=seed, db_url=db_url, name=name, lifetime_epsilon=lifetime_epsilon,
                        lifetime_delta=lifetime_delta, stages=stages,
                        collecting_name=f"{name[:-1]}, collecting reports)")
