"""examples/ (issue 42: "sample files"): the README's "With real people" commands, run on those files against the
real service — opt-in users enrolled from ``optin-users.txt`` with a private token file each, Alice's searches
uploaded with her token, a device credential made and a device's searches reported with it.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from hybriddp.cli import cli
from hybriddp.service import create_app
from hybriddp.service.demo import local_server

ADMIN = "admin-token-of-the-example-tests-0123"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(*args: Any) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args], env={"HYBRIDDP_ADMIN_TOKEN": ADMIN})
    assert result.exit_code == 0, result.output + result.stderr
    return result


def test_the_example_files_through_the_readmes_commands(tmp_path: Path) -> None:
    users = EXAMPLES.joinpath("optin-users.txt").read_text().split()
    with local_server(create_app(f"sqlite:///{tmp_path / 'db.sqlite'}", ADMIN)) as url:
        rid = json.loads(run("round", "create", "--server", url, "--epsilon", 8, "-M", 10, "--json").stdout)["id"]
        run("round", "enrol", rid, "--server", url, "--users-file", EXAMPLES / "optin-users.txt",
            "--out", tmp_path / "tokens")
        tokens = sorted(p.name for p in (tmp_path / "tokens").iterdir())
        assert tokens == sorted(f"{u}.token" for u in users)
        assert all(stat.S_IMODE((tmp_path / "tokens" / t).stat().st_mode) == 0o600 for t in tokens)
        run("round", "upload", rid, "--server", url, "--token-file", tmp_path / "tokens" / "alice.token",
            "--input", EXAMPLES / "alice-searches.csv")
        counts = json.loads(run("round", "status", rid, "--server", url, "--json").stdout)["counts"]
        assert (counts["optin_users"], counts["optin_records"]) == (3, 4)  # three enrolled; Alice's four searches

        # a device needs a published head list: a second round whose opt-in group is simulated
        second = json.loads(run("round", "create", "--server", url, "--epsilon", 8, "-M", 10, "--json").stdout)["id"]
        run("simulate", second, "--server", url, "--scale", "0.005", "--optin-users", 1500, "--json")
        run("round", "publish", second, "--server", url)
        run("credentials", "create", "--server", url, "--count", 1, "--out", tmp_path / "credentials.txt")
        credential = tmp_path / "credential"
        credential.write_text((tmp_path / "credentials.txt").read_text().splitlines()[0] + "\n")
        sent = json.loads(run("participate", "--server", url, "--round", second, "--input",
                              EXAMPLES / "device-searches.csv", "--credential-file", credential, "--report-now",
                              "--no-device-ledger", "--json").stdout)
        assert sent["counted"] == 1
        assert json.loads(run("round", "status", second, "--server", url, "--json").stdout)["counts"]["reports"] == 1
