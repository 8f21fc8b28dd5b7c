"""A throwaway PostgreSQL cluster for tests and benchmarks.

``PgCluster.start()`` runs ``initdb`` and ``pg_ctl`` from the server binaries (default
/usr/lib/postgresql/15/bin, or ``$HYBRIDDP_PG_BINDIR``) in a fresh temporary directory, listening
on 127.0.0.1 and a free port with trust authentication on loopback only; ``create_database()``
hands out a new, empty database; ``stop()`` stops the server and removes the directory.

``initdb`` refuses to run as root, so as root every server command runs as the ``postgres`` user
(``runuser -u postgres --``) in a directory that user owns; as any other user the commands run
as that user. A missing binary or user raises ``PgClusterError`` naming what to install: the
tests that use the cluster fail (never skip), because in CI a missing part is a failure.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from hybriddp.service.process import free_port

DEFAULT_BINDIR = "/usr/lib/postgresql/15/bin"
INSTALL_HINT = ("install the PostgreSQL 15 server (Debian/Ubuntu as root: `apt-get install -y postgresql-15`, "
                "which also creates the `postgres` user), or point HYBRIDDP_PG_BINDIR at a directory holding "
                "initdb, pg_ctl and postgres")


class PgClusterError(RuntimeError):
    """The test cluster cannot be set up; the message says what to install or fix."""


def _default_bindir() -> str:
    """/usr/lib/postgresql/15/bin, or else the newest other version installed the Debian way."""
    if os.access(Path(DEFAULT_BINDIR) / "initdb", os.X_OK):
        return DEFAULT_BINDIR
    others = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                    key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return str(others[-1].parent) if others else DEFAULT_BINDIR


class PgCluster:
    """One PostgreSQL server in a temporary directory, for the length of a test session.

    Parameters
    ----------
    bindir:
        Directory with ``initdb``, ``pg_ctl`` and ``postgres`` (default ``$HYBRIDDP_PG_BINDIR``, else
        /usr/lib/postgresql/15/bin, else the newest /usr/lib/postgresql/N/bin).
    durable:
        ``False`` (tests) turns off fsync and synchronous commit: the server is never killed, so
        nothing is lost, and tests run faster. ``True`` (benchmarks) keeps PostgreSQL's defaults.
    """

    def __init__(self, bindir: str | None = None, *, durable: bool = False) -> None:
        self.bindir = Path(bindir or os.environ.get("HYBRIDDP_PG_BINDIR") or _default_bindir())
        self.durable = durable
        self.port: int | None = None
        self.root: Path | None = None
        self._names = itertools.count(1)
        self._as_postgres = os.geteuid() == 0
        self.user = "postgres" if self._as_postgres else pwd.getpwuid(os.geteuid()).pw_name

    # -- setup ---------------------------------------------------------------------------------
    def _check(self) -> None:
        """Refuse with what to install when a binary or the ``postgres`` user is missing."""
        missing = [name for name in ("initdb", "pg_ctl", "postgres")
                   if not os.access(self.bindir / name, os.X_OK)]
        if missing:
            raise PgClusterError(f"PostgreSQL server binaries {', '.join(missing)} not found in {self.bindir}: "
                                 f"{INSTALL_HINT}")
        if self._as_postgres:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise PgClusterError("running as root, but there is no `postgres` user to run initdb as (initdb "
                                     f"refuses to run as root): {INSTALL_HINT}, or `useradd --system postgres`"
                                     ) from None
            if shutil.which("runuser") is None:
                raise PgClusterError("running as root, but `runuser` (util-linux) is missing: install util-linux")

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a server binary (as ``postgres`` when we are root); raise with its output on failure."""
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              cwd="/")
        if proc.returncode != 0:
            log = ""
            if self.root is not None and (self.root / "server.log").exists():
                log = (self.root / "server.log").read_text(errors="replace")[-3000:]
            raise PgClusterError(f"`{' '.join(args)}` failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
                                 f"{log}")
        return proc

    def start(self) -> PgCluster:
        """initdb + pg_ctl start on a free loopback port; returns self."""
        self._check()
        self.root = Path(tempfile.mkdtemp(prefix="hybriddp-pg-"))
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        data = self.root / "data"
        try:
            self._run("initdb", "-D", str(data), "-U", self.user, "--auth=trust", "--encoding=UTF8",
                      "--locale=C", "--no-sync")
            # Loopback only: trust authentication is for this throwaway cluster and nothing else.
            (data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
            if self._as_postgres:
                os.chown(data / "pg_hba.conf", pwd.getpwnam("postgres").pw_uid, pwd.getpwnam("postgres").pw_gid)
            settings = [f"-c unix_socket_directories={self.root}", "-c listen_addresses=127.0.0.1",
                        "-c max_connections=200", "-c shared_buffers=128MB"]
            if not self.durable:
                settings += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
            for attempt in range(5):
                self.port = free_port()
                try:
                    self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(data), "-l", str(self.root / "server.log"),
                              "-o", " ".join([*settings, f"-p {self.port}"]), timeout=90)
                    break
                except PgClusterError:
                    if attempt == 4:  # another process took the port five times in a row, or a real failure
                        raise
        except BaseException:
            self._remove()
            raise
        self._watch()
        return self

    def _watch(self) -> None:
        """A detached shell that stops the server and removes its directory should this process die
        without calling :meth:`stop` (a test run killed by a timeout): no server outlives its test run."""
        assert self.root is not None
        pg_ctl = [str(self.bindir / "pg_ctl"), "stop", "-m", "immediate", "-D", str(self.root / "data")]
        if self._as_postgres:
            pg_ctl = ["runuser", "-u", "postgres", "--", *pg_ctl]
        script = ('while kill -0 "$0" 2>/dev/null && [ -d "$1" ]; do sleep 1; done; '
                  'if [ -d "$1" ]; then shift; root="$1"; shift; "$@" >/dev/null 2>&1; rm -rf "$root"; fi')
        subprocess.Popen(["sh", "-c", script, str(os.getpid()), str(self.root), str(self.root), *pg_ctl],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)

    # -- use -----------------------------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL (psycopg 3) of ``database`` on this cluster."""
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "test") -> str:
        """A new, empty database; returns its SQLAlchemy URL."""
        import psycopg  # the service's PostgreSQL driver; imported here so SQLite-only use needs none

        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')  # name built above, never from input
        return self.url(name)

    # -- teardown ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the server (immediate: nothing in it is kept) and remove its directory."""
        if self.root is None:
            return
        if (self.root / "data" / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.root / "data"))
            except (PgClusterError, subprocess.TimeoutExpired):
                pass  # removed below all the same; a leftover server dies with its directory gone
        self._remove()

    def _remove(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
