"""``hybriddp serve`` as a child process: started, waited for, SIGKILLed and started again on the same
database. Used by the reliability and browser tests and by ``benchmarks/bench_service.py``, which
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
        t0 = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hybriddp", "serve", "--db", self.db_url, "--host", "127.0.0.1",
                 "--port", str(self.port), "--admin-token-file", str(self.token_file), *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server did not answer /health within {timeout} s:\n{self.log_text()[-4000:]}")

    def kill9(self) -> None:
        """SIGKILL, as a crash would (nothing is flushed or shut down)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """Terminate (a clean shutdown), or kill after 20 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")
