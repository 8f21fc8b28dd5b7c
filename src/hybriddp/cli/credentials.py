"""``hybriddp credentials …``: device credentials on a running ``hybriddp serve`` (admin token needed).

A device credential admits a device to report tokens (docs/TOKENS.md): with it, ``hybriddp participate
--credential-file`` (or the SDK's ``DeviceClient(credential=...)``) gets one blind-signed token per message.
"""

from __future__ import annotations

import click
from rich.table import Table

from hybriddp.cli import render
from hybriddp.cli.remote import admin_client, admin_options, json_option


@click.group("credentials")
def credentials_group() -> None:
    """Make, list and revoke device credentials (report tokens, docs/TOKENS.md)."""


@credentials_group.command("create")
@admin_options
@click.option("--count", type=click.IntRange(1, 10_000), default=1, show_default=True,
              help="How many credentials to make (one per device).")
@click.option("--tokens-per-round", type=click.IntRange(1, 10_000_000), default=1, show_default=True,
              help="Report tokens each credential may get per round: 1 for a device (it sends one message a round "
                   "and re-sends it with the same token); a relay that submits for many devices needs more.")
@click.option("--label", default=None, help="A note for people (e.g. the device group); shown by `list`.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the secrets to this file, one per line (mode 0600, written atomically) instead of printing "
                   "them. Give each device its line (`hybriddp participate --credential-file`).")
@json_option
def create_cmd(server: str, admin_token_file: str | None, count: int, tokens_per_round: int, label: str | None,
               out_path: str | None, as_json: bool) -> None:
    """Make device credentials. Their secrets are shown once (the server keeps only their SHA-256)."""
    from hybriddp.core.atomic import check_output_path, write_private_text
    if out_path is not None:
        check_output_path(out_path, "--out")
    with admin_client(server, admin_token_file) as admin:
        made = admin.create_credentials(count, tokens_per_round=tokens_per_round, label=label)
    if out_path is not None:
        write_private_text(out_path, "".join(c["credential"] + "\n" for c in made))
        made = [{k: v for k, v in c.items() if k != "credential"} for c in made]
        render.err.print(f"{len(made)} device credential(s) written to {out_path} (mode 0600), one per line")
    if as_json:
        render.print_json({"credentials": made})
        return
    _table(made, with_secret=out_path is None)


@credentials_group.command("list")
@admin_options
@json_option
def list_cmd(server: str, admin_token_file: str | None, as_json: bool) -> None:
    """List device credentials (ids, labels, limits, revocation; never the secrets)."""
    with admin_client(server, admin_token_file) as admin:
        creds = admin.credentials()
    if as_json:
        render.print_json({"credentials": creds})
        return
    _table(creds, with_secret=False)


@credentials_group.command("revoke")
@admin_options
@click.argument("credential_id", type=click.IntRange(1))
@json_option
def revoke_cmd(server: str, admin_token_file: str | None, credential_id: int, as_json: bool) -> None:
    """Revoke a device credential: it gets no more report tokens (tokens already issued stay valid)."""
    with admin_client(server, admin_token_file) as admin:
        cred = admin.revoke_credential(credential_id)
    if as_json:
        render.print_json(cred)
        return
    render.out.print(f"device credential {cred['id']} revoked at {cred['revoked']}")


def _table(creds: list[dict[str, object]], *, with_secret: bool) -> None:
    table = Table(title="device credentials")
    for col in ("id", "label", "tokens per round", "created", "revoked") + (("credential (shown once)",)
                                                                          if with_secret else ()):
        table.add_column(col, overflow="fold")
    for c in creds:
        row = [str(c["id"]), str(c.get("label") or ""), str(c["tokens_per_round"]), str(c["created"]),
               str(c.get("revoked") or "")]
        table.add_row(*row + ([str(c["credential"])] if with_secret else []))
    render.out.print(table)
