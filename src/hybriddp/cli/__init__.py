"""The ``hybriddp`` command line.

Every command validates its input at the boundary; a :class:`~hybriddp.core.errors.HybridDPError`
(or a device-side error, or an OS error on a file) is printed as one line on stderr and the
command exits with status 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from hybriddp.cli.audit import audit_cmd
from hybriddp.cli.credentials import credentials_group
from hybriddp.cli.experiment import experiment_cmd
from hybriddp.cli.files import estimate_cmd, headlist_cmd, randomize_cmd
from hybriddp.cli.mean import mean_group
from hybriddp.cli.participate import participate_cmd
from hybriddp.cli.privacy import privacy_group
from hybriddp.cli.relay import relay_cmd
from hybriddp.cli.rounds import round_group
from hybriddp.cli.run import demo_cmd, run_cmd
from hybriddp.cli.series import series_group
from hybriddp.cli.serve import serve_cmd
from hybriddp.cli.simulate import simulate_cmd
from hybriddp.cli.synth import synth_cmd
from hybriddp.cli.trends import trends_cmd
from hybriddp.cli.tune import tune_cmd
from hybriddp.core.errors import HybridDPError
from hybriddp.core.protocol import DeviceError
from hybriddp.core.version import __version__


class _Group(click.Group):
    """Turns expected errors into a one-line message and exit status 2.

    Bad input — a :class:`HybridDPError`, an OS error on a file, or a usage error Click finds
    (an unknown option, a value of the wrong type) — is printed as one ``error: ...`` line on
    stderr, exit status 2. Ctrl-C prints ``interrupted``, exit status 130. Anything else is a bug
    and keeps its traceback.
    """

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:  # bare `hybriddp`: the help
                click.echo(exc.ctx.get_help())
                sys.exit(0)
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.echo(f"error: {' '.join(exc.format_message().split())}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(2)
        except click.exceptions.Abort:
            click.echo("interrupted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (HybridDPError, DeviceError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except OSError as exc:
            click.echo(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
            sys.exit(2)
        except MemoryError:
            click.echo("error: out of memory; try a smaller input or --m-c/--m-o 1", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="hybriddp")
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """hybriddp: heavy hitters under the hybrid model of differential privacy (BLENDER).

    A small opt-in group trusts the curator; every other user (a client) randomizes on
    their own device. `demo` runs everything on built-in synthetic data; `run` on your log;
    `headlist` → `randomize` → `estimate` is the same pipeline split across the curator,
    the devices and the server.
    """
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


import hybriddp.cli.export  # noqa: E402, F401  (registers `round export`)

for _cmd in (demo_cmd, run_cmd, headlist_cmd, randomize_cmd, estimate_cmd, synth_cmd, privacy_group, experiment_cmd,
             audit_cmd, mean_group, tune_cmd, round_group, series_group, credentials_group, participate_cmd, serve_cmd,
             relay_cmd, trends_cmd, simulate_cmd):
    cli.add_command(_cmd)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="hybriddp")
