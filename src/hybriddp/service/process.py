"""``hybriddp serve`` (and ``hybriddp relay``) as a child process: started, waited for, SIGKILLed and started again
on the same database. Used by the reliability and browser tests and by ``benchmarks/bench_service.py``, which
need the real server (uvicorn, worker processes, a crash) rather than the app in-process.
"""

from __future__ import annotations

import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(args: list[str], log: Path, health_url: str, what: str, timeout: float
           ) -> tuple[subprocess.Popen[bytes], float]:
    """Start ``python -m hybriddp ARGS`` (output appended to ``log``) and wait until ``health_url`` answers 200;
    (the process, the seconds that took). RuntimeError (with the end of the log) if it exits first or does not
    answer within ``timeout`` seconds."""
    t0 = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hybriddp", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            if httpx.get(health_url, timeout=2).status_code == 200:
                return proc, time.monotonic() - t0
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer {health_url} within {timeout} s:\n"
                       f"{log.read_text(errors='replace')[-4000:]}")


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """Terminate a started child (a clean shutdown), or kill it after 20 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ServeProcess:
    """``python -m hybriddp serve`` on ``db_url`` at a free local port, its output in ``workdir/server.log``.

    ``extra_args``: more ``hybriddp serve`` options (``--demo``, ``--workers N``, ...);
    ``admin_token``: written to ``workdir/admin-token`` (default: a random one).
    """

    def __init__(self, db_url: str, workdir: Path, extra_args: tuple[str, ...] = (), *,
                 admin_token: str | None = None) -> None:
        self.db_url = db_url
        self.extra_args = extra_args
        self.port = free_port()
        self.token = admin_token or secrets.token_urlsafe(24)
        self.token_file = workdir / "admin-token"
        self.token_file.write_text(self.token + "\n")
        self.log = workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.admin = {"Authorization": f"Bearer {self.token}"}

    def start(self, timeout: float = 60.0) -> float:
        """Start and wait until ``/health`` answers; the seconds that took. RuntimeError (with the end of
        the log) if the server exits or does not answer within ``timeout`` seconds."""
        self.proc, took = launch(["serve", "--db", self.db_url, "--host", "127.0.0.1", "--port", str(self.port),
                                  "--admin-token-file", str(self.token_file), *self.extra_args],
                                 self.log, self.base_url + "/health", "the server", timeout)
        return took

    def kill9(self) -> None:
        """SIGKILL, as a crash would (nothing is flushed or shut down)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """Terminate (a clean shutdown), or kill after 20 s."""
        stop(self.proc)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class RelayProcess:
    """``python -m hybriddp relay --target URL`` at a free local port, its output in ``workdir/relay.log``."""

    def __init__(self, target: str, workdir: Path) -> None:
        self.target, self.port, self.log = target, free_port(), workdir / "relay.log"
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        """Start and wait until ``/healthz`` answers (RuntimeError otherwise, as :meth:`ServeProcess.start`)."""
        self.proc, _ = launch(["relay", "--target", self.target, "--host", "127.0.0.1", "--port", str(self.port),
                               "--log-level", "warning"], self.log, self.base_url + "/healthz", "the relay", timeout)

    def stop(self) -> None:
        stop(self.proc)
