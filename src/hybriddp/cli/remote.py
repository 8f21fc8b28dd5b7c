"""Options and tokens of the commands that talk to a running ``hybriddp serve`` through the SDK
(:mod:`hybriddp.sdk`): the server's URL, the admin token (``--admin-token-file`` or ``HYBRIDDP_ADMIN_TOKEN``),
an opt-in user's token, ``--json``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from hybriddp.core.errors import DataError

DEFAULT_SERVER = "http://127.0.0.1:8000"


def server_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--server URL`` (environment: ``HYBRIDDP_SERVER``)."""
    return click.option("--server", envvar="HYBRIDDP_SERVER", default=DEFAULT_SERVER, show_default=True,
                        help="Base URL of `hybriddp serve` (environment: HYBRIDDP_SERVER).")(f)


def admin_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--server`` and ``--admin-token-file``."""
    f = click.option("--admin-token-file", type=click.Path(dir_okay=False), default=None,
                     help="File holding the admin token `hybriddp serve` was started with. Default: the "
                          "HYBRIDDP_ADMIN_TOKEN environment variable.")(f)
    return server_option(f)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: print the server's JSON."""
    return click.option("--json", "as_json", is_flag=True, help="Print the server's JSON instead of a table.")(f)


def read_token(path: str | None, env: str, what: str, option: str) -> str:
    """A bearer token from a file (first line) or the environment; a clear error when neither has one."""
    if path is not None:
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.readline().strip()
        except FileNotFoundError:
            raise DataError(f"{option} {path}: no such file; give the file holding the {what}") from None
        except UnicodeDecodeError:
            raise DataError(f"{option} {path} is not a text file; it must hold the {what} on its first line") from None
        if not token:
            raise DataError(f"{option} {path} is empty; it must hold the {what} on its first line")
        return token
    token = os.environ.get(env, "").strip()
    if not token:
        raise DataError(f"no {what}: give {option} FILE or set the environment variable {env}")
    return token


def admin_client(server: str, token_file: str | None) -> Any:
    """An :class:`~hybriddp.sdk.AdminClient` of ``server`` with the admin token of ``token_file`` or the environment."""
    from hybriddp.sdk import AdminClient
    return AdminClient(server, read_token(token_file, "HYBRIDDP_ADMIN_TOKEN", "admin token", "--admin-token-file"))

