"""``hybriddp serve``: the collection service (FastAPI on Uvicorn) on SQLite or PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from hybriddp.core.atomic import write_text
from hybriddp.core.errors import DataError, parameter_error

DEFAULT_DATA_DIR = "hybriddp-data"
TOKEN_NAME = "admin-token"
DB_NAME = "hybriddp.db"


@contextlib.contextmanager
def _private_umask() -> Iterator[None]:
    """New files readable by their owner only (0600) while the block runs (the CLI is single-threaded here)."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def admin_token(token_file: str | None, data_dir: Path) -> tuple[str, Path, bool]:
    """(token, file, new): the token in ``token_file`` or ``<data_dir>/admin-token``, or a new random one
    (``new``; not written yet: :func:`save_token` writes it once the server could be set up)."""
    path = Path(token_file) if token_file is not None else data_dir / TOKEN_NAME
    if token_file is not None and not path.is_file():
        raise DataError(f"--admin-token-file {path}: no such file; write a token of at least 16 characters into it, "
                        "or leave the option out and a random token is generated in the data directory")
    if not path.exists():
        return secrets.token_urlsafe(32), path, True
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read the admin token file {path}: {exc}") from None
    if len(token) < 16:
        raise DataError(f"the admin token in {path} has {len(token)} characters; use at least 16 (e.g. "
                        "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        click.echo(f"warning: {path} is readable by other users (mode {stat.filemode(mode)}); chmod 600 it", err=True)
    return token, path, False


def check_port(host: str, port: int) -> None:
    """Bind ``host``:``port`` as uvicorn will (the same address family, SO_REUSEADDR) and let it go at once, so a
    busy port is refused before anything is created: a ClickException (``error: port P on HOST is in use (…);
    choose another with --port``, exit status 2) when the port is taken or the address cannot be listened on.
    Port 0 (any free port) is not checked. A port taken between this check and the server's own bind still makes
    the server fail then."""
    import errno
    import socket

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(f"port {port} on {host} is in use ({why}); choose another with --port"
                                       ) from None
        raise click.ClickException(f"cannot listen on port {port} of {host} ({why}); check --host, or choose "
                                   "another port with --port") from None


def save_token(path: Path, token: str) -> None:
    """Write a generated token, readable by its owner only (0600 from the first byte on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _private_umask():
        write_text(path, token + "\n")


@click.command("serve")
@click.option("--db", "db_url", default=None, metavar="URL",
              help="Database: sqlite:///PATH (embedded; WAL, every acknowledged write on disk) or "
                   "postgresql+psycopg://USER[:PASSWORD]@HOST:PORT/DATABASE (needs hybriddp[postgres]). "
                   f"Default: sqlite:///<data-dir>/{DB_NAME}. The schema is created or migrated at start-up.")
@click.option("--data-dir", default=DEFAULT_DATA_DIR, show_default=True, type=click.Path(file_okay=False),
              help="Directory for the default SQLite database and the generated admin token (created if missing).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 listens on every interface (put a TLS proxy in front).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--admin-token-file", default=None, type=click.Path(dir_okay=False),
              help=f"File holding the administrators' bearer token (at least 16 characters; surrounding whitespace "
                   f"ignored). Default: <data-dir>/{TOKEN_NAME}, generated (random, mode 0600) if missing.")
@click.option("--lifetime-epsilon", type=click.FloatRange(0, min_open=True), default=None,
              help="Lifetime privacy budget ε of every opt-in user over all rounds (basic composition; a round "
                   "that would exceed it is refused before anything is published). Fixed when the database is "
                   "created. Default for a new database: 16.")
@click.option("--lifetime-delta", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="Lifetime δ of every opt-in user, in (0, 1). Fixed when the database is created. "
                   "Default for a new database: 1e-4.")
@click.option("--max-body-bytes", type=click.IntRange(1024), default=16 * 1024 * 1024, show_default=True,
              help="Largest request body, in bytes (16 MiB); a larger one is refused with 413. Device batches "
                   "must fit (about 100 bytes per one-report message).")
@click.option("--body-deadline", type=click.FloatRange(1, 86400), default=30.0, show_default=True, metavar="SECONDS",
              help="Slack of a request body, in seconds: a body gets this long to begin with, every byte received "
                   "adds 1/--min-body-rate s, but never to more than this from now. So a body of N bytes must arrive "
                   "within SECONDS + N / --min-body-rate (a 16 MiB one within 30 s + 256 s), and a client that "
                   "trickles is refused (408) at most SECONDS after it last kept the rate; a part that takes over "
                   "20 s is refused too.")
@click.option("--min-body-rate", type=click.IntRange(1), default=64 * 1024, show_default=True, metavar="BYTES/S",
              help="Average rate, in bytes a second, a request body must keep once its --body-deadline slack is "
                   "spent (64 KiB/s = 512 kbit/s, a slow mobile link); slower bodies are refused (408) and their "
                   "bytes leave the in-flight budget at once.")
@click.option("--check-workers", type=click.IntRange(0, 64), default=None,
              help="Worker processes that parse and check large report bodies (over 64 KiB), so batches use "
                   "more than one core; 0 checks them in a thread of the server process. Default: one per CPU, "
                   "at most 4.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Server processes sharing the port (each with its own group-commit writer and check workers), "
                   "to use more than one core for many small requests. Rounds, reports and results live in the "
                   "database, so any process answers any request; /metrics counters are per process.")
@click.option("--demo", is_flag=True, help="Before serving, run a demo round through the service into the database "
              "(the aol preset at --scale 0.1: opt-in uploads, head list, device reports, close), so its results and "
              "local-search document can be opened at once, and leave a second round collecting reports (the "
              "local-search page's contribute switch sends to it).")
@click.option("--optin-max-records", type=click.IntRange(1), default=10_000, show_default=True,
              help="Records (or values) one opt-in token may upload in its round; more is refused (HTTP 413).")
@click.option("--optin-max-bytes", type=click.IntRange(1), default=16 << 20, show_default=True,
              help="Request bytes one opt-in token may upload in its round; more is refused (HTTP 413).")
@click.option("--insecure-testing-seeds", "allow_seeds", is_flag=True,
              help="TESTING ONLY: accept rounds created with a seed. A seeded round gives NO privacy (anyone who "
                   "knows the seed regenerates its noise); such rounds are marked non-private in the API, the pages "
                   "and the ledger, and their seed is never published. Off: seeded rounds are refused (HTTP 403).")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="An origin (scheme://host[:port]) whose pages may call this API from a browser; repeat for more. "
                   "Default: none: browsers may send state-changing requests (reports, uploads, admin) only from "
                   "this server's own pages, and cross-site ones are refused with 403 (docs/DEPLOYMENT.md). A TLS "
                   "proxy that rewrites the Host header must list the public origin here.")
@click.option("--public-metrics", is_flag=True,
              help="Serve /metrics without the administrator token (for a scraper on a private network). Default: "
                   "/metrics needs 'Authorization: Bearer <admin token>'.")
@click.option("--private-round-details", is_flag=True,
              help="Show a round's state, parameters and counts (GET /api/v1/rounds/ID) to administrators only. "
                   "Default: public (the round page /rounds/ID reads it; opt-in counts are shown to administrators "
                   "only either way).")
@click.option("--open-admission", is_flag=True,
              help="UNSAFE, demos only: take device reports without report tokens, so anything that can reach the "
                   "server may report, as often as it likes (fake devices can then steer the results). Default: "
                   "every report needs a token, blind-signed for an admitted device (docs/TOKENS.md); the pages "
                   "say when a server runs open.")
@click.option("--self-enrolment", is_flag=True,
              help="Demos only: give a device credential (one report token per round) to any caller of this "
                   "server's own pages (POST /api/v1/device-credentials/self). It bounds tokens per credential, not "
                   "per person. On with --demo. Default: only the administrator makes credentials "
                   "(`hybriddp credentials create`).")
@click.option("--series-tick", type=click.FloatRange(0), default=30.0, show_default=True,
              help="Seconds between two runs of the round-series scheduler, which opens, publishes and closes each "
                   "series' rounds on schedule (docs/SERIES.md). 0: none (a cron job calls `hybriddp series "
                   "advance` instead). With --workers N every process runs it; each step happens once anyway.")
@click.option("--limit-concurrency", type=click.IntRange(16), default=1024, show_default=True,
              help="Open connections and tasks per server process beyond which new requests get 503 at once "
                   "(uvicorn's limit): slow or unfinished requests cannot pile up without bound.")
@click.option("--shutdown-grace", type=click.FloatRange(0, 600), default=5.0, show_default=True, metavar="SECONDS",
              help="Seconds the requests in flight get to finish after SIGTERM or Ctrl-C (no new connection is taken "
                   "meanwhile); then they are cancelled, the queued reports stored, and the process has ended at most "
                   "3 s later whatever still runs (a transaction waiting for a lock is rolled back; nothing "
                   "acknowledged is lost). Keep it under the supervisor's stop timeout (systemd TimeoutStopSec, "
                   "Kubernetes terminationGracePeriodSeconds) minus 3 s.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True, help="Uvicorn's log level. Access logs (with client addresses) are never written.")
def serve_cmd(db_url: str | None, data_dir: str, host: str, port: int, admin_token_file: str | None,
              lifetime_epsilon: float | None, lifetime_delta: float | None, max_body_bytes: int,
              body_deadline: float, min_body_rate: int, check_workers: int | None, workers: int, demo: bool,
              optin_max_records: int, optin_max_bytes: int,
              allow_seeds: bool, cors_origins: tuple[str, ...], public_metrics: bool, private_round_details: bool,
              open_admission: bool, self_enrolment: bool, series_tick: float, limit_concurrency: int,
              shutdown_grace: float, log_level: str) -> None:
    """Run the collection service: BLENDER and hybrid-mean rounds over HTTP.

    Opt-in users upload raw records with their own tokens; an administrator publishes the head list
    (the privacy ledger is charged first, then the raw records are deleted); devices fetch it,
    randomize and report; the administrator closes the round and the results are published
    (JSON, CSV, Parquet, and a local-search document). API at /docs and /openapi.json,
    /health, /metrics. No address or other identifier of a device is stored with its report.
    """
    import uvicorn

    from hybriddp.service import create_app
    from hybriddp.service.bodies import set_body_pace

    set_body_pace(body_deadline, min_body_rate)
    if lifetime_epsilon is not None and not math.isfinite(lifetime_epsilon):
        raise parameter_error("lifetime_epsilon (--lifetime-epsilon)", lifetime_epsilon, "a finite number > 0")
    check_port(host, port)  # before the data directory, the database or a token exists
    data = Path(data_dir)
    token, token_path, generated = admin_token(admin_token_file, data)
    if db_url is None:
        data.mkdir(parents=True, exist_ok=True)
        db_url = f"sqlite:///{(data / DB_NAME).resolve()}"
    if demo:
        from hybriddp.cli.servicedemo import populate_demo_round
        demo_round, collecting_round = populate_demo_round(db_url, lifetime_epsilon, lifetime_delta)
    from hybriddp.service.checkpool import DEFAULT_CHECK_WORKERS
    if check_workers is None:
        check_workers = max(1, DEFAULT_CHECK_WORKERS // workers)
    limits = {"optin_max_records": optin_max_records, "optin_max_bytes": optin_max_bytes, "allow_seeds": allow_seeds,
              "cors_origins": list(cors_origins), "public_metrics": public_metrics,
              "private_round_details": private_round_details, "open_admission": open_admission,
              "self_enrolment": self_enrolment or demo, "series_tick": series_tick}
    app = create_app(db_url, token, max_body_bytes=max_body_bytes, lifetime_epsilon=lifetime_epsilon,
                     lifetime_delta=lifetime_delta, check_workers=check_workers, warm_check_workers=True, **limits)
    _warn_unsafe(limits)
    store = app.state.store
    if generated:
        save_token(token_path, token)
        click.echo(f"admin token generated: {token_path} (mode 0600); send it as 'Authorization: Bearer <token>'")
    else:
        click.echo(f"admin token: {token_path}")
    click.echo(f"database: {store.engine.url.render_as_string(hide_password=True)} (opt-in lifetime budget "
               f"epsilon {store.lifetime_epsilon:g}, delta {store.lifetime_delta:g})")
    click.echo(f"serving on http://{host}:{port} (API docs at /docs); Ctrl-C stops")
    if demo:
        _print_demo_pages(f"http://{host}:{port}", demo_round, collecting_round)
    # client addresses are never used: not even X-Forwarded-For is read (proxy_headers=False)
    # http: uvicorn's httptools protocol sending each response in one write (hybriddp.service.http)
    # limit_concurrency: 503 beyond it; timeout_keep_alive: idle connections closed after 5 s; a request body
    # that stalls or comes too slowly is refused (service.bodies.BodyPace); SIGTERM/SIGINT: in-flight requests get
    # --shutdown-grace, the process ends EXIT_MARGIN_S later at the latest (bounded_exit)
    options = {"host": host, "port": port, "log_level": log_level, "access_log": False, "server_header": False,
               "proxy_headers": False, "http": "hybriddp.service.http:Protocol",
               "limit_concurrency": limit_concurrency, "timeout_keep_alive": 5,
               "timeout_graceful_shutdown": shutdown_grace}
    if workers > 1:  # the database is set up (migrated, recovered); each worker builds its own app on it
        store.close()
        os.environ[WORKER_CONFIG] = json.dumps({
            "db_url": db_url, "token_file": str(token_path), "max_body_bytes": max_body_bytes,
            "check_workers": check_workers, "parent": os.getpid(), "limits": limits,
            "body_pace": [body_deadline, min_body_rate], "shutdown_grace": shutdown_grace})
        uvicorn.run("hybriddp.cli.serve:worker_app", factory=True, workers=workers, **options)
        return
    from hybriddp.service.checkpool import tune_interpreter
    tune_interpreter()  # once the app is built: what exists now is frozen out of the collector's way

    def factory() -> object:  # called by uvicorn once its signal handlers are in place
        bounded_exit(shutdown_grace + EXIT_MARGIN_S)
        return app
    uvicorn.run(factory, factory=True, **options)


def _print_demo_pages(base: str, demo_round: str | None, collecting_round: str | None) -> None:
    """Where ``serve --demo``'s rounds are (nothing when the demo could not run)."""
    if demo_round is None:
        return
    click.echo(f"demo round: {base}/api/v1/rounds/{demo_round}/local-search")
    click.echo(f"local-search page: {base}/")
    click.echo(f"round page: {base}/rounds/{demo_round}")
    if collecting_round is not None:
        click.echo(f"collecting round page: {base}/rounds/{collecting_round}")


def _warn_unsafe(limits: dict[str, Any]) -> None:
    """Say on stderr which of the settings in ``limits`` make the server unfit for real users' data."""
    if limits["allow_seeds"]:
        click.echo("WARNING: --insecure-testing-seeds: this server accepts seeded rounds, which give NO privacy; "
                   "never use it with real users' data", err=True)
    if limits["open_admission"]:
        click.echo("WARNING: --open-admission: device reports need no token; anything that can reach this server "
                   "may report as often as it likes (demos only)", err=True)
    if limits["self_enrolment"]:
        click.echo("note: self-enrolment is on: any caller of this server's pages gets a device credential "
                   "(demos only; --self-enrolment, or --demo)", err=True)


EXIT_MARGIN_S = 3.0
"""Seconds a server process has, after the ``--shutdown-grace`` that follows SIGTERM or Ctrl-C, to shut its app
down (the report writer stores what is queued; check workers and database connections are closed) before it ends
whatever still runs (:func:`bounded_exit`). With the default grace of 5 s a process has ended 8 s after SIGTERM."""


def bounded_exit(seconds: float) -> None:
    """Make the first SIGTERM or SIGINT of this server process also start a timer that ends the process
    ``seconds`` later if it still runs. Call it once uvicorn's own handlers are in place (from the app factory):
    they are chained, not replaced.

    uvicorn stops accepting at once and cancels what is in flight after its ``timeout_graceful_shutdown``, but a
    transaction running in a worker thread cannot be cancelled, and Python waits for such threads before it exits.
    The timer ends the process then; the database rolls back what was not committed (SQLite's journal,
    PostgreSQL's closed connection). Nothing acknowledged is lost: a report is acknowledged only after its
    commit (:mod:`hybriddp.service.writer`), an opt-in upload only after its transaction."""
    if threading.current_thread() is not threading.main_thread():  # signals are the main thread's
        return
    armed = threading.Event()

    def arm() -> None:
        if not armed.is_set():
            armed.set()
            threading.Thread(target=_exit_after, args=(seconds,), name="hybriddp-exit-deadline", daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if callable(previous):
            signal.signal(sig, lambda num, frame, previous=previous: (arm(), previous(num, frame)))


def _exit_after(seconds: float) -> None:
    time.sleep(seconds)
    sys.stderr.write(f"hybriddp serve: still running {seconds:g} s after the stop signal (a transaction in flight); "
                     "exiting now: what was not committed is rolled back, nothing acknowledged is lost\n")
    sys.stderr.flush()
    os._exit(1)


WORKER_CONFIG = "HYBRIDDP_SERVE_WORKER"
"""Environment variable through which ``serve --workers N`` hands its settings to the worker processes."""


def worker_app() -> object:
    """The app of one ``serve --workers N`` process (uvicorn calls this factory in each worker).

    The admin token is read from its file (never passed in the environment). The worker exits when
    the ``serve`` process is gone, even after SIGKILL, so no orphan keeps serving the port, and within
    ``--shutdown-grace`` + :data:`EXIT_MARGIN_S` of SIGTERM (:func:`bounded_exit`).
    """
    from hybriddp.service import create_app
    from hybriddp.service.bodies import set_body_pace
    from hybriddp.service.checkpool import tune_interpreter, watch_parent

    cfg = json.loads(os.environ[WORKER_CONFIG])
    token = Path(cfg["token_file"]).read_text(encoding="utf-8").strip()
    set_body_pace(*cfg["body_pace"])
    app = create_app(cfg["db_url"], token, max_body_bytes=cfg["max_body_bytes"],
                     check_workers=cfg["check_workers"], recover=False, warm_check_workers=True, **cfg["limits"])
    watch_parent(cfg["parent"])
    tune_interpreter()
    bounded_exit(cfg["shutdown_grace"] + EXIT_MARGIN_S)
    return app
