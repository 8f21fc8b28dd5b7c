"""``hybriddp audit``: an empirical lower bound on ε from the real mechanism code.

See :mod:`hybriddp.audit` (issue "Privacy assurance"; Jagielski et al. 2020, Nasr et al. 2021).
Exit status 0 when the bound does not exceed the claim, 1 when it does (a privacy bug, or a
1 − confidence accident), 2 on bad arguments.
"""

from __future__ import annotations

import sys

import click
from rich.table import Table

from hybriddp.audit import DEFAULTS, MECHANISMS, AuditResult, audit
from hybriddp.audit.run import MAX_EPSILON, MAX_TRIALS
from hybriddp.cli import render
from hybriddp.cli.options import seed_option

_DEFAULTS_HELP = "; ".join(f"{m} {e:g}" for m, (e, _) in DEFAULTS.items())
_DELTA_HELP = "; ".join(f"{m} {d:g}" for m, (_, d) in DEFAULTS.items())


@click.command("audit")
@click.option("--mechanism", type=click.Choice(MECHANISMS), required=True,
              help="localalg: the client randomizer (ALGORITHM.md §5); headlist: CreateHeadList (§3); optin-estimate: "
                   "the opt-in noisy counts (§4); local-only: the OLH report of the local-only baseline.")
@click.option("--epsilon", type=float, default=None,
              help=f"Claimed ε to audit, in (0, {MAX_EPSILON:.2f}]. Default: {_DEFAULTS_HELP}.")
@click.option("--delta", type=float, default=None,
              help=f"Claimed δ (subtracted before bounding ε). Default: {_DELTA_HELP}.")
@click.option("--trials", type=int, default=1_000_000, show_default=True,
              help=f"Runs of the mechanism on each of the two neighbouring inputs, 1 to {MAX_TRIALS:,} (about an "
                   "hour for the slowest mechanism). Ctrl-C stops cleanly.")
@click.option("--confidence", type=float, default=0.99, show_default=True,
              help="Joint confidence of all Clopper-Pearson bounds (Bonferroni over the tests).")
@click.option("--noise", type=click.Choice(["discrete", "laplace"]), default="discrete", show_default=True,
              help="Curator noise (headlist, optin-estimate): exact discrete Laplace or floating-point Laplace.")
@click.option("--f-c", "f_c", type=float, default=0.85, show_default=True,
              help="localalg: share of the client's budget spent on the query.")
@seed_option(help="Seed for a reproducible audit; default: OS randomness.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def audit_cmd(mechanism: str, epsilon: float | None, delta: float | None, trials: int, confidence: float,
              noise: str, f_c: float, seed: int | None, as_json: bool) -> None:
    """Empirical privacy audit: a statistical lower bound on ε from the real mechanism code.

    A distinguishing attack on worst-case neighbouring inputs runs the mechanism TRIALS times on
    each, counts a likelihood-ratio-optimal output event, and prints the lower bound on ε
    (one-sided Clopper-Pearson) next to the claimed ε. Exit status 1 if the bound exceeds the
    claim."""
    with render.interruptible(), render.count_progress(f"auditing {mechanism}", trials, not as_json) as progress:
        res = audit(mechanism, epsilon=epsilon, delta=delta, trials=trials, seed=seed, confidence=confidence,
                    noise=noise, f_c=f_c, progress=progress)
    if as_json:
        render.print_json(res.to_json())
    else:
        print_audit(res)
    if res.violation:
        sys.exit(1)


def print_audit(res: AuditResult) -> None:
    """Claim, bound, the event behind it, and every test."""
    out = render.out
    b = res.best
    conf = f"{res.confidence:.0%}" if res.confidence * 100 == round(res.confidence * 100) else f"{res.confidence:g}"
    out.print(f"audit of {res.mechanism}: {res.trials:,} trials per input, {conf} confidence "
              f"(one-sided Clopper-Pearson, {len(res.tests)} tests, Bonferroni)")
    out.print(f"claimed       epsilon = {res.epsilon_claimed:.4f}   delta = {res.delta:g}")
    out.print(f"lower bound   epsilon >= {res.epsilon_lower_bound:.4f}   delta >= {res.delta_lower_bound:.3g}")
    out.print(f"event: {b.event} on {b.x} (x) vs {b.x_prime} (x'): {b.count_x:,} vs {b.count_x_prime:,} "
              f"of {res.trials:,}")
    for scenario in dict.fromkeys(r.scenario for r in res.tests):
        rows = [r for r in res.tests if r.scenario == scenario]
        event = next(r.event for r in rows if not r.complement)
        t = Table(title=f"{scenario}; E = {event}", title_justify="left")
        for col in ("event", "order", "count num.", "count den.", "P[.|num.] >=", "P[.|den.] <=", "eps lb",
                    "delta lb"):
            t.add_column(col, justify="left" if col in ("event", "order") else "right")
        for r in rows:
            t.add_row("not E" if r.complement else "E", "x' vs x" if r.swapped else "x vs x'", f"{r.count_x:,}",
                      f"{r.count_x_prime:,}", f"{r.p_x_lower:.4g}", f"{r.p_x_prime_upper:.4g}",
                      f"{r.epsilon_lower_bound:.4f}", f"{r.delta_lower_bound:.3g}")
        out.print(t)
    if res.violation:
        out.print("[red]VIOLATION: the empirical lower bound exceeds the claim[/red]")
    else:
        out.print("no violation: the empirical lower bound does not exceed the claim")
