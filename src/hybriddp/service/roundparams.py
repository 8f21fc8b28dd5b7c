"""A round's parameters in the collection service: what a BLENDER or a mean round takes, checked and completed with
defaults when the round is created (:func:`validate_params`), and read back as the library's objects
(:func:`blender_params`, :func:`defense`, :func:`mean_mechanism`, :func:`schedule`).

A BLENDER round takes everything :class:`~hybriddp.core.params.BlenderParams` checks, plus the curator's noise,
whether records have URLs, the defense against fake reports (ALGORITHM.md §7.2) and the report schedule
(docs/TOKENS.md); a mean round takes ε and the public range [lower, upper] (ALGORITHM.md §11), and optionally a
known σ². A round stored before a key existed reads back with what it was computed with.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from hybriddp.core.errors import parameter_error
from hybriddp.core.noise import NOISE_CLASSES, noise_factory
from hybriddp.core.params import LEGACY_ESTIMATOR, BlenderParams, check_seed
from hybriddp.mean import VARIANCE_SHARE, Hybrid, HybridUnknownVariance
from hybriddp.mean.inputs import MAX_USERS, check_noise_scales
from hybriddp.server.anchor import (
    DEFAULT_ALPHA,
    DEFAULT_HONEST_COST,
    DEFAULT_KAPPA,
    DEFAULT_KAPPA_QUERY,
    DEFAULT_RANK_COST,
    FIXED_KAPPA_QUERY,
    MEAN_DEFAULT_KAPPA,
    AnchorPolicy,
    policy_named,
)

KINDS = ("blender", "mean")

_BLENDER_FIELDS = [f.name for f in fields(BlenderParams)]
DEFENSE_KEYS = ("defense", "anchor_alpha", "anchor_kappa")
SCHEDULE_KEYS = ("issuance_seconds", "report_seconds", "min_tokens")
BLENDER_KEYS = (*_BLENDER_FIELDS, "noise", "url_level", *DEFENSE_KEYS, "anchor_kappa_query", "anchor_honest_cost",
                "anchor_rank_cost", "seed", *SCHEDULE_KEYS)
MEAN_KEYS = ("epsilon", "lower", "upper", "sigma2", "variance_share", *DEFENSE_KEYS, "seed", *SCHEDULE_KEYS)
SCHEDULE_DEFAULTS = {"issuance_seconds": 3600.0, "report_seconds": 3600.0, "min_tokens": 0}
"""When devices report (docs/TOKENS.md "When a device reports"): the issuance window after the head list's
publication, then the report window in which every device sends at a uniformly random time; reports are refused
until ``min_tokens`` tokens were issued in the round. A round stored before these keys existed has the defaults."""
MAX_WINDOW_SECONDS = 90 * 86400.0
DEFENSE_DEFAULTS = {"defense": "anchor", "anchor_alpha": DEFAULT_ALPHA, "anchor_kappa": DEFAULT_KAPPA}
"""A new round's defense (ALGORITHM.md §7.2); a round stored before these keys existed has none (:func:`defense`)."""


def _check_keys(kind: str, params: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise parameter_error(f"params of a {kind} round", ", ".join(unknown), f"among {', '.join(known)}")


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise parameter_error(name, value, "true or false")
    return value


def validate_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The round's parameters, checked and completed with defaults (stored with the round)."""
    if kind == "blender":
        _check_keys(kind, params, BLENDER_KEYS)
        out = {**BlenderParams().to_dict(), "noise": next(iter(NOISE_CLASSES)), "url_level": True, "seed": None,
               **DEFENSE_DEFAULTS, "anchor_kappa_query": DEFAULT_KAPPA_QUERY,
               "anchor_honest_cost": DEFAULT_HONEST_COST, "anchor_rank_cost": DEFAULT_RANK_COST, **params}
        defense(out)
        _flag("project", out["project"])
        _flag("url_level", out["url_level"])
        if not isinstance(out["noise"], str):
            raise parameter_error("noise", out["noise"], " or ".join(repr(n) for n in NOISE_CLASSES))
        noise_factory(out["noise"])
        check_seed(out["seed"])
        blender_params(out)  # every range check of the library
        return check_schedule(out)
    if kind == "mean":
        _check_keys(kind, params, MEAN_KEYS)
        for name in ("epsilon", "lower", "upper"):
            if name not in params:
                raise parameter_error(name, None, "given: a mean round needs epsilon, lower and upper")
        out = {"sigma2": None, "variance_share": VARIANCE_SHARE, "seed": None, **DEFENSE_DEFAULTS,
               "anchor_kappa": MEAN_DEFAULT_KAPPA, **params}
        check_seed(out["seed"])
        defense(out)
        mean_mechanism(out)
        # every group size a round can have (1 .. MAX_USERS) keeps the noise and the errors finite
        rho = out["variance_share"] if out["sigma2"] is None else None
        check_noise_scales(out["epsilon"], 1, 1, rho)
        check_noise_scales(out["epsilon"], MAX_USERS / 2, MAX_USERS / 2, rho)
        from hybriddp.curator.mean import integer_scale
        for eps in [out["epsilon"]] if rho is None else [rho * out["epsilon"], (1.0 - rho) * out["epsilon"]]:
            integer_scale(1, eps, "epsilon")  # the curator's exact noise can run: refused now, not after the charge
        return check_schedule(out)
    raise parameter_error("kind", kind, " or ".join(repr(k) for k in KINDS))


def check_schedule(params: dict[str, Any]) -> dict[str, Any]:
    """The round's schedule keys (:data:`SCHEDULE_DEFAULTS`), checked; ``params`` completed with them."""
    out = {**SCHEDULE_DEFAULTS, **params}
    for name, flag in (("issuance_seconds", "--issuance-window"), ("report_seconds", "--report-window")):
        v = out[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_WINDOW_SECONDS:
            raise parameter_error(f"{name} ({flag})", v, f"a number of seconds in [0, {MAX_WINDOW_SECONDS:g}]",
                                  "0 makes devices send at once, which lets the operator link reports to tokens")
        out[name] = float(v)
    v = out["min_tokens"]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**9:
        raise parameter_error("min_tokens (--min-tokens)", v, "an integer from 0 to 1e9 (tokens issued before the "
                              "round takes reports)")
    return out


def schedule(params: dict[str, Any]) -> dict[str, Any]:
    """The round's schedule (older rounds: the defaults)."""
    return {k: params.get(k, SCHEDULE_DEFAULTS[k]) for k in SCHEDULE_KEYS}


def defense(params: dict[str, Any]) -> AnchorPolicy | None:
    """The round's defense against fake reports (ALGORITHM.md §7.2): None for ``"none"`` and for a round stored
    before the field existed (its published results were computed without one). A round stored before
    ``anchor_kappa_query`` existed bounded its queries by ``anchor_kappa``; a mean round has no queries. A round
    stored before ``anchor_kappa`` could be null (per round) has a fixed one."""
    if "defense" not in params:
        return None
    kappa = params.get("anchor_kappa", DEFAULT_KAPPA)
    return policy_named(params["defense"], params.get("anchor_alpha", DEFAULT_ALPHA), kappa,
                        params.get("anchor_kappa_query", FIXED_KAPPA_QUERY if kappa is None else kappa),
                        params.get("anchor_honest_cost", DEFAULT_HONEST_COST),
                        params.get("anchor_rank_cost", DEFAULT_RANK_COST))


def blender_params(params: dict[str, Any]) -> BlenderParams:
    """The library parameters of a BLENDER round."""
    given = {k: params[k] for k in _BLENDER_FIELDS if k in params}  # older rounds lack newer fields: defaults
    given.setdefault("estimator", LEGACY_ESTIMATOR)  # a round stored before the field: the paper's
    try:
        return BlenderParams(**given)
    except TypeError as exc:  # e.g. a string where a number belongs
        raise parameter_error("params", given, f"numbers of the right type ({exc})") from None


def mean_mechanism(params: dict[str, Any]) -> Hybrid:
    """Hybrid (σ² given) or HybridUnknownVariance (σ² estimated privately from the opt-in group)."""
    kw = {"lower": params["lower"], "upper": params["upper"], "epsilon": params["epsilon"]}
    if params["sigma2"] is None:
        return HybridUnknownVariance(**kw, variance_share=params["variance_share"])
    return Hybrid(**kw, sigma2=params["sigma2"])
