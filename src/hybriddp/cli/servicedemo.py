"""The service demos: ``hybriddp demo --service`` (one round through a real local server) and
``hybriddp serve --demo`` (a finished round and a collecting one in the database before serving)."""

from __future__ import annotations

from typing import Any

import click

from hybriddp.cli import render
from hybriddp.core.errors import parameter_error


def demo_through_service(log: Any, params: Any, *, seed: int | None, as_json: bool, output: str | None, top: int,
                         algorithm: str, noise: str, source: str) -> None:
    """``hybriddp demo --service``: the same round as ``demo``, through a real local server
    (:func:`hybriddp.service.demo.service_demo`); prints the same tables (or JSON)."""
    from hybriddp.cli.options import check_output
    from hybriddp.service.demo import service_demo
    from hybriddp.simulation.groups import check_algorithm_params, check_group_sizes
    from hybriddp.simulation.pipeline import Stages

    if algorithm != "blender":
        raise parameter_error("--algorithm", algorithm, "blender with --service",
                              "The collection service runs BLENDER rounds; drop --service to simulate the baselines.")
    check_output(output)
    check_algorithm_params(algorithm, params, log)
    check_group_sizes(log, params, algorithm, noise, source)
    render.warn_delta(params.delta, log.n_users)
    with render.interruptible(), render.stage_progress(not as_json) as on_stage:
        stages = Stages(on_stage)
        done = service_demo(log, params, seed=seed, noise=noise, stages=stages)
    res = done.result
    if output:
        res.write(output)
    service = {"round": done.round["id"], "state": done.round["state"], "messages_acknowledged":
               done.reports.acknowledged, "messages_counted": done.reports.counted,
               "duplicates": done.reports.duplicates, "database": "temporary SQLite"}
    if as_json:
        obj = res.to_json()
        obj["stage_seconds"] = stages.seconds
        obj["service"] = service
        render.print_json(obj)
        return
    render.print_figure9(res, top)
    render.print_summary(res)
    render.out.print(f"service: round {service['round']} on a local server with a temporary SQLite database; "
                     f"{done.reports.acknowledged:,} device messages acknowledged ({done.reports.counted:,} counted)")
    if output:
        render.out.print(f"wrote {output}")


DEMO_SCALE = 0.1
"""`serve --demo`: the aol preset at this scale (52k users, 2.6k opt-in) runs in well under a minute."""


def populate_demo_round(db_url: str, lifetime_epsilon: float | None,
                        lifetime_delta: float | None) -> tuple[str | None, str | None]:
    """``hybriddp serve --demo``: run a demo round into the database before serving and leave a second one
    collecting reports; returns their ids (finished, collecting).

    The demo's clients wait long and retry (:data:`hybriddp.service.demo.DEMO_RETRY`), so a busy machine delays
    the demo. If it fails all the same (the server keeps refusing or not answering), a warning says so on stderr
    and (None, None) is returned: ``serve`` then serves the database as it is rather than exiting."""
    import httpx

    from hybriddp.sdk.http import ServiceRequestError
    from hybriddp.service.demo import populate_demo
    from hybriddp.simulation.pipeline import Stages

    render.err.print(f"running a demo round (the aol preset at --scale {DEMO_SCALE:g}, paper defaults) through the "
                     "service into the database, then opening a second one for reports …")
    try:
        with render.interruptible(), render.stage_progress(True) as on_stage:
            done = populate_demo(db_url, scale=DEMO_SCALE, lifetime_epsilon=lifetime_epsilon,
                                 lifetime_delta=lifetime_delta, stages=Stages(on_stage))
    except (ServiceRequestError, httpx.HTTPError, TimeoutError) as exc:
        if not _transient(exc):
            raise  # a refusal (e.g. a --lifetime-epsilon too small for the demo's round): exit 2 as bad input
        click.echo(f"warning: the demo round could not be run ({' '.join(str(exc).split()) or type(exc).__name__}); "
                   "serving without it. The database may hold an unfinished demo round (`hybriddp round list`; "
                   "abort it with `hybriddp round abort ID`); restart with --demo to try again.", err=True)
        return None, None
    res = done.result
    click.echo(f"demo round {done.round['id']}: {render.head_list_size(res.head_list, res.url_level)}, "
               f"{done.reports.counted:,} device reports, results published")
    if done.collecting is not None:
        click.echo(f"demo round {done.collecting['id']}: head list published, collecting reports")
    return str(done.round["id"]), None if done.collecting is None else str(done.collecting["id"])


def _transient(exc: Exception) -> bool:
    """A failure a busy machine causes (no answer in time, a dropped connection, 408/429/5xx), not a refusal."""
    status = getattr(exc, "status", None)
    return status is None or status in (408, 429) or status >= 500
