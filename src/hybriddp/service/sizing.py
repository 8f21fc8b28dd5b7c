"""Sizing a service round (issue 42; :mod:`hybriddp.tune.sizing`): the forecast of a BLENDER round from its stored
parameters and the opt-in users it has (or expects), and the advice an empty head list gives a service round.

Both read the round's public parameters, a count of opt-in users the operator already sees and the built-in prior:
no data, no privacy cost. The messages never contain a count of the data.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, get_type_hints

from pydantic import BaseModel, Field, create_model

from hybriddp.core.errors import EmptyHeadListError
from hybriddp.core.params import BlenderParams
from hybriddp.tune.sizing import RoundForecast, forecast_round

_KEYS = ("epsilon", "delta", "head_list_size", "m_o", "m_c", "f_o", "f_c", "project", "estimator")


def params_forecast(params: dict[str, Any], optin_users: int | None = None,
                    devices: int | None = None, ndcg_trials: int = 0) -> RoundForecast:
    """The forecast of a BLENDER round with the stored ``params`` (the simulated NDCG only when asked)."""
    bp = BlenderParams(**{k: params[k] for k in _KEYS if k in params})
    return forecast_round(bp, noise=params.get("noise", "discrete"), optin_users=optin_users, devices=devices,
                          ndcg_trials=ndcg_trials)


def empty_list_message(exc: EmptyHeadListError, params: dict[str, Any]) -> str:
    """What an empty head list tells the operator of a service round: the public parameters, that the run was
    charged and the round ended, and advice that applies to a service round (as many opt-in users as the
    forecast says one record needs, or a larger ε or δ)."""
    need = params_forecast(params).optin_for_one
    users = f"about {need:,} opt-in users" if need is not None else "far more opt-in users"
    return ("the head list is empty: CreateHeadList kept no record (none passed the privacy threshold "
            f"τ = {exc.tau:.4g} at ε = {exc.epsilon:g}, δ = {exc.delta:g}, m_O = {exc.m_o}, "
            f"from {exc.n_optin_users:,} opt-in users). The run was charged "
            "to them and the round has ended: a new round is a new release, charged again. For a list, enrol "
            f"{users} in the next round (`hybriddp round create --expect-optin N --dry-run` forecasts it on the "
            "built-in prior), or create it with a larger --epsilon or --delta")


def _forecast_model() -> type[BaseModel]:
    """``ForecastOut`` (``GET /api/v1/rounds/{id}/forecast``): the fields of :class:`RoundForecast`, with their
    descriptions, and ``lines``, the forecast as sentences."""
    hints = get_type_hints(RoundForecast)
    spec: dict[str, Any] = {}
    for f in fields(RoundForecast):
        doc = f.metadata.get("doc")
        if f.default_factory is not MISSING:
            info = Field(default_factory=f.default_factory, description=doc)
        else:
            info = Field(... if f.default is MISSING else f.default, description=doc)
        spec[f.name] = (hints[f.name], info)
    spec["lines"] = (list[str], Field(default_factory=list, description="The forecast as sentences, as the CLI "
                                                                         "prints it."))
    return create_model("ForecastOut", __doc__="What a BLENDER round can expect (docs/TUNE.md \"Sizing a round\").",
                        **spec)


ForecastOut = _forecast_model()


def round_forecast(params: dict[str, Any], optin_users: int | None) -> dict[str, Any]:
    """The API's forecast document (:class:`ForecastOut`; without the simulated NDCG, which takes seconds)."""
    fc = params_forecast(params, optin_users)
    return {**fc.to_json(), "lines": fc.lines()}
