"""``hybriddp audit``: an empirical lower bound on ε from the real mechanism code, or (``--exact``) the exact δ.

See :mod:`hybriddp.audit` (Jagielski et al. 2020, Nasr et al. 2021; PRIVACY.md) and
:mod:`hybriddp.audit.exact` (ALGORITHM.md §3.5). Exit status 0 when the bound does not exceed the claim, 1 when
it does (a privacy bug, or for the sampling audit a 1 − confidence accident), 2 on bad arguments.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from hybriddp.audit import DEFAULTS, MECHANISMS, AuditResult, audit
from hybriddp.audit.exact import EXACT_DEFAULTS, EXACT_MECHANISMS, ExactResult, exact_audit
from hybriddp.audit.run import MAX_EPSILON, MAX_TRIALS
from hybriddp.cli import render
from hybriddp.cli.options import seed_option

_DEFAULTS_HELP = "; ".join(f"{m} {e:g}" for m, (e, _) in DEFAULTS.items())
_DELTA_HELP = "; ".join(f"{m} {d:g}" for m, (_, d) in DEFAULTS.items())
_EXACT_HELP = "; ".join(f"{m} {d:g}" for m, (_, d) in EXACT_DEFAULTS.items())


@click.command("audit")
@click.option("--mechanism", type=click.Choice(MECHANISMS), required=True,
              help="localalg: the client randomizer (ALGORITHM.md §5); headlist: CreateHeadList with its released "
                   "noisy counts (§3, §3.3); optin-estimate: the opt-in noisy counts (§4); local-only: the OLH "
                   "report of the local-only baseline. The audit runs the library function production runs.")
@click.option("--exact", is_flag=True,
              help="Compute the exact worst-case delta at e^epsilon (hockey-stick divergence over all neighbouring "
                   "datasets, from the mechanism's exact output law; ALGORITHM.md §3.5) instead of sampling. For "
                   f"{', '.join(EXACT_MECHANISMS)}; discrete noise only. --trials, --confidence and --seed are "
                   "not used. This is the delta test at the paper's delta = 1e-5, which sampling cannot reach.")
@click.option("--m-o", "m_o", type=int, default=None,
              help="headlist, optin-estimate: records sampled per opt-in user, 1, 2 or 3 (the user may hold one "
                   "record several times, so a neighbour moves up to m_O units of count). Default: 1.")
@click.option("--epsilon", type=float, default=None,
              help=f"Claimed ε to audit, in (0, {MAX_EPSILON:.2f}] (headlist: above ln 2). Default: {_DEFAULTS_HELP}.")
@click.option("--delta", type=float, default=None,
              help=f"Claimed δ, a probability in [0, 1) (headlist: > 0). Sampling: subtracted before bounding ε; "
                   f"default {_DELTA_HELP}. Sampling cannot test headlist at the paper's δ = 1e-5: its δ event then "
                   "has probability ≤ 5e-6, a handful of events in 10^6 trials, so the default is 1e-2 and --exact "
                   "is the δ test at 1e-5. --exact: default " + _EXACT_HELP + ".")
@click.option("--trials", type=int, default=1_000_000, show_default=True,
              help=f"Runs of the mechanism on each of the two neighbouring inputs, 1 to {MAX_TRIALS:,} (about three "
                   "hours for the slowest mechanism, headlist; 10^6 take about 10 s). Ctrl-C stops cleanly.")
@click.option("--confidence", type=float, default=0.99, show_default=True,
              help="Joint confidence of all Clopper-Pearson bounds (Bonferroni over the tests), in (0, 1).")
@click.option("--noise", type=click.Choice(["discrete", "laplace"]), default="discrete", show_default=True,
              help="Curator noise (headlist, optin-estimate): exact discrete Laplace or floating-point Laplace.")
@click.option("--f-c", "f_c", type=float, default=0.85, show_default=True,
              help="localalg: share of the client's budget spent on the query, in (0, 1).")
@seed_option(help="Seed for a reproducible audit; default: OS randomness.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def audit_cmd(mechanism: str, exact: bool, m_o: int | None, epsilon: float | None, delta: float | None, trials: int,
              confidence: float, noise: str, f_c: float, seed: int | None, as_json: bool) -> None:
    """Privacy audit of a mechanism's code: a statistical lower bound on ε, or the exact δ.

    Sampling (the default): a distinguishing attack on worst-case neighbouring inputs runs the
    mechanism TRIALS times on each, counts likelihood-ratio-optimal output events, and prints the lower
    bound on ε (one-sided Clopper-Pearson) next to the claimed ε. --exact: the worst-case δ at e^ε,
    computed from the mechanism's exact output law, next to the claimed δ. Exit status 1 if the
    claim is refuted."""
    if exact:
        _report(exact_audit(mechanism, epsilon=epsilon, delta=delta, m_o=m_o, noise=noise, f_c=f_c), as_json,
                print_exact)
        return
    with render.interruptible(), render.count_progress(f"auditing {mechanism}", trials, not as_json) as progress:
        res = audit(mechanism, epsilon=epsilon, delta=delta, trials=trials, seed=seed, confidence=confidence,
                    noise=noise, f_c=f_c, m_o=m_o, progress=progress)
    _report(res, as_json, print_audit)


def _report(res: Any, as_json: bool, printer: Callable[[Any], None]) -> None:
    """Print an audit's result (JSON or the table ``printer`` draws); exit 1 when the claim is refuted."""
    if as_json:
        render.print_json(res.to_json())
    else:
        printer(res)
    if res.violation:
        sys.exit(1)


def print_audit(res: AuditResult) -> None:
    """Claim, bound, the event behind it, and every test."""
    out = render.out
    b = res.best
    conf = f"{res.confidence:.0%}" if res.confidence * 100 == round(res.confidence * 100) else f"{res.confidence:g}"
    m_o = res.details.get("m_o")
    where = f", m_O = {m_o}" if m_o is not None else ""
    out.print(f"audit of {res.mechanism}{where}: {res.trials:,} trials per input, {conf} confidence "
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


def print_exact(res: ExactResult) -> None:
    """Claim, exact δ, the neighbouring pair that reaches it, and the model check, one quantity per row."""
    out = render.out
    d = res.details
    what = res.mechanism + (f", m_O = {res.m_o}" if res.m_o is not None else "")
    what += f", {res.noise} noise" if res.noise is not None else ""
    out.print(f"exact audit of {what}: the worst-case hockey-stick divergence at e^epsilon over all "
              "neighbouring datasets (ALGORITHM.md §3.5)")
    rows = [("claimed epsilon", f"{res.epsilon_claimed:g}"), ("claimed delta", f"{res.delta:.4g}"),
            ("exact delta(e^epsilon)", f"{res.delta_exact:.4g}")]
    if res.mechanism == "localalg":
        rows += [("worst pair of records (x vs x')", f"{res.worst['x']} vs {res.worst['x_prime']}"),
                 ("largest privacy loss", f"{d['max_finite_loss']:.6g}"), ("f_C", f"{d['f_c']:g}"),
                 ("head list", f"{len(d['head_list'])} entries (3 queries of 2 URLs)")]
    else:
        rows += [("noise scale t (>= 2 m_O/epsilon)", f"{d['noise_scale']:.6g}")]
        if "tau" in d:
            rows += [("threshold tau_d", str(d["tau"]))]
        rows += [("largest finite privacy loss", f"{d['max_finite_loss']:.6g}"),
                 ("worst move: counts fall (x -> x')", ", ".join(res.worst["falling"])),
                 ("            and rise (x -> x')", ", ".join(res.worst["rising"])),
                 ("moves searched", f"{d['pairs_searched']:,}")]
    t = Table(title_justify="left")
    t.add_column("quantity", justify="left")
    t.add_column("value", justify="right")
    for row in rows:
        t.add_row(*row)
    out.print(t)
    mc = res.model_check
    if mc is not None:
        state = "releases exactly" if mc["passed"] else "[red]does NOT release[/red]"
        out.print(f"model check: {mc['function']} {state} the modelled output on {mc['cases']:,} "
                  "(count, draw) cases")
    if res.violation:
        out.print("[red]VIOLATION: the exact delta exceeds the claim, or the code does not match its law[/red]")
    else:
        out.print("no violation: the exact delta does not exceed the claimed delta")
