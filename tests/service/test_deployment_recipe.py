"""docs/DEPLOYMENT.md's PostgreSQL recipe, run as written (issue 42: "a deployment recipe with PostgreSQL that a
test follows").

The test reads the shell block after the marker ``<!-- recipe: run by tests/service/test_deployment_recipe.py -->``
and runs it with ``bash -euo pipefail``, setting only the three variables the recipe's preamble exports
(``HYBRIDDP_DB``: a fresh database on the session's throwaway PostgreSQL server; ``HYBRIDDP_HOME``; ``PORT``) and the
PATH of this Python (so ``hybriddp`` and ``python`` are the installed package's). It passes when every line
succeeds and what the recipe promises is there: results with listed records, the opt-in users in the ledger, the
admin token private, and the server stopped.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from pgcluster import PgCluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "DEPLOYMENT.md"
MARKER = "<!-- recipe: run by tests/service/test_deployment_recipe.py -->"


def recipe() -> str:
    text = DOC.read_text(encoding="utf-8")
    assert MARKER in text, f"{DOC} lost its recipe marker"
    block = re.search(r"```bash\n(.*?)```", text[text.index(MARKER):], re.S)
    assert block is not None
    return block.group(1)


def test_the_recipe_runs_as_written_on_postgresql(pg_cluster: PgCluster, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "srv"
    env = {**os.environ, "HYBRIDDP_DB": pg_cluster.create_database(), "HYBRIDDP_HOME": str(home), "PORT": str(port),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "120"}
    for key in ("HYBRIDDP_SERVER", "HYBRIDDP_ADMIN_TOKEN"):
        env.pop(key, None)
    script = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + recipe()  # a failed line stops the server too
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    log = (home / "serve.log").read_text() if (home / "serve.log").exists() else ""
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nserver log:\n{log[-3000:]}"
    table = pq.read_table(home / "results.parquet")
    assert table.num_rows > 0 and (~table.column("wildcard").to_numpy(zero_copy_only=False)).any()
    assert "3,000" in done.stdout  # the ledger names the 3,000 opt-in users charged
    assert stat.S_IMODE((home / "admin-token").stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    deadline = time.monotonic() + 15  # `kill "$SERVER"`: SIGTERM lets requests in flight finish (5 s), then it ends
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _listening(port)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
