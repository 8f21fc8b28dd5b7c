"""Sizing a service round (issue 42; :mod:`hybriddp.tune.sizing`): the forecast of a BLENDER round from its stored
parameters and the opt-in users it has (or expects), and the advice an empty head list gives a service round.

Both read the round's public parameters, a count of opt-in users the operator already sees and the built-in prior:
no data, no privacy cost. The messages never contain a count of the data.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

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


class ForecastOut(BaseModel):
    """``GET /api/v1/rounds/{id}/forecast``: what a BLENDER round can expect (:class:`RoundForecast`)."""

    epsilon: float
    delta: float
    m_o: int
    f_o: float
    head_list_size: int
    noise: str
    tau: float = Field(description="The noisy count in S a record needs to be listed (ALGORITHM.md §3).")
    optin_for_one: int | None = Field(description="Opt-in users for one listed record with 99% probability.")
    optin_for_full: int | None = Field(description="Opt-in users for all M records (99%); null: out of reach.")
    model: str = Field(description="The population model the forecast assumes.")
    optin_users: int | None = Field(None, description="The opt-in users it was made for: the round's uploads so far "
                                                      "unless the request gave optin_users.")
    devices: int | None = None
    head_list_mean: float | None = Field(None, description="Expected |HL_S| (before the cut at M).")
    head_list_range: list[int] | None = Field(None, description="The list's likely size, 90% range, at most M.")
    p_empty: float | None = Field(None, description="Probability that the head list is empty.")
    ndcg: float | None = Field(None, description="Expected generalized NDCG (with devices given).")
    ndcg_trials: int = 0
    warnings: list[str] = Field(default_factory=list)
    lines: list[str] = Field(default_factory=list, description="The forecast as sentences, as the CLI prints it.")


def round_forecast(params: dict[str, Any], optin_users: int | None) -> dict[str, Any]:
    """The API's forecast document (:class:`ForecastOut`; without the simulated NDCG, which takes seconds)."""
    fc = params_forecast(params, optin_users)
    return {**fc.to_json(), "lines": fc.lines()}
