"""Request and response models of the HTTP API (pydantic), so that /openapi.json states the real shapes.

The models check types and ranges that a schema can express; the library's own checks
(:class:`hybriddp.core.params.BlenderParams`, :mod:`hybriddp.mean`) run after them and give the
last word, with the library's messages (HTTP 422).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hybriddp.core.estimators import ESTIMATORS, describe_estimators
from hybriddp.core.params import LN2, MAX_EPSILON_HEAD_LIST, MAX_RECORDS_PER_USER, MAX_SEED, MIN_DELTA, BlenderParams
from hybriddp.core.protocol import ID_PATTERN
from hybriddp.mean import VARIANCE_SHARE
from hybriddp.server.anchor import (
    DEFAULT_ALPHA,
    DEFAULT_HONEST_COST,
    DEFAULT_KAPPA,
    DEFAULT_KAPPA_QUERY,
    DEFAULT_RANK_COST,
    DEFENSES,
    MEAN_DEFAULT_KAPPA,
)
from hybriddp.service.store import DEFAULT_RETENTION_HOURS, MAX_RETENTION_HOURS

_D = BlenderParams()
Text = Annotated[str, Field(pattern=r"^[^\x00]*$")]
"""A string without NUL characters (PostgreSQL cannot store them; refused alike on every database)."""
MAX_TEXT = 10_000
"""Longest query, URL, user name or round name accepted (characters)."""

STATES = Literal["collecting-optin", "building-headlist", "headlist-published", "collecting-reports", "closed",
                 "results-held", "results-published", "headlist-empty", "aborted", "deleted"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


DEFENSE = Field(DEFENSES[0], description="'anchor' (default): test every estimate from the devices against the "
                "opt-in group's, publish flagged ones from the opt-in group, bound the devices' influence on the rest "
                "(docs/ALGORITHM.md §7.2); 'none': the undefended blend, which fake devices can steer.")
ANCHOR_ALPHA = Field(DEFAULT_ALPHA, gt=0, lt=1, description="False-alarm rate of the anchor test per round (Holm "
                     "over all entries and queries).")


def anchor_kappa(default: float | None) -> Any:
    """The ``anchor_kappa`` field with a round kind's default (BLENDER null: per round; mean 3: ALGORITHM.md §7.2)."""
    return Field(default, ge=0, le=1e6, description="The bound: no published estimate lies more than this many "
                 "standard deviations from its opt-in estimate. null (a BLENDER round's default): chosen per round "
                 "and entry, as tight as anchor_honest_cost allows.")


class _Schedule(_Strict):
    """When devices report (docs/TOKENS.md "When a device reports"): every round kind's schedule."""

    issuance_seconds: float = Field(3600.0, ge=0, le=90 * 86400, description="Seconds after the head list's "
                                    "publication during which devices get their report tokens (the issuance window; "
                                    "docs/TOKENS.md).")
    report_seconds: float = Field(3600.0, ge=0, le=90 * 86400, description="Seconds of the report window that "
                                  "follows: every device sends at a uniformly random time in it, so report times say "
                                  "nothing about token issuance (0 and 0: at once, linkable).")
    min_tokens: int = Field(0, ge=0, le=10**9, description="Reports are refused (409 too_few_tokens) until this many "
                            "report tokens were issued in the round: the smallest anonymity set it accepts.")


class BlenderParamsIn(_Schedule):
    """BLENDER's parameters (ALGORITHM.md §2); every one has the library's default."""

    epsilon: float = Field(_D.epsilon, gt=LN2, le=MAX_EPSILON_HEAD_LIST,
                           description="ε of every user, opt-in and client (> ln 2).")
    delta: float = Field(_D.delta, ge=MIN_DELTA, lt=1, description="δ of every user.")
    head_list_size: int = Field(_D.head_list_size, ge=1, le=1_000_000, description="M: records kept in the head list.")
    m_o: int = Field(_D.m_o, ge=1, le=MAX_RECORDS_PER_USER, description="m_O: records sampled per opt-in user.")
    m_c: int = Field(_D.m_c, ge=1, le=MAX_RECORDS_PER_USER, description="m_C: reports per device.")
    f_o: float = Field(_D.f_o, gt=0, lt=1, description="f_O: share of opt-in users that build the head list.")
    f_c: float = Field(_D.f_c, gt=0, lt=1, description="f_C: share of a device's budget spent on the query.")
    noise: Literal["discrete", "laplace"] = Field("discrete", description="The curator's noise.")
    project: bool = Field(_D.project, description="Project the blended estimates onto the simplex.")
    estimator: Literal[ESTIMATORS] = Field(  # type: ignore[valid-type]  # the registry's names
        _D.estimator, description=f"Estimates: {describe_estimators()}. Default: '{_D.estimator}'.")
    optin_fraction: float = Field(_D.optin_fraction, gt=0, lt=1, description="Not used by the service (whoever "
                                  "enrols is opt-in); kept with the parameters, e.g. to reproduce a simulation.")
    url_level: bool = Field(True, description="Records are (query, clicked URL); false: queries alone.")
    defense: Literal[DEFENSES] = DEFENSE  # type: ignore[valid-type]  # the server's choices
    anchor_alpha: float = ANCHOR_ALPHA
    anchor_kappa: float | None = anchor_kappa(DEFAULT_KAPPA)
    anchor_honest_cost: float = Field(DEFAULT_HONEST_COST, gt=0, lt=1, description="With anchor_kappa null: the "
                                      "largest share of an honest estimate's variance the bound may add.")
    anchor_kappa_query: float | None = Field(DEFAULT_KAPPA_QUERY, ge=0, le=1e6, description="The suggestions' "
                                             "ranking guard: queries are ranked by their estimate capped this many "
                                             "standard deviations above the opt-in group's (ALGORITHM.md §7.2). null "
                                             "(the default): 0.1 where the opt-in estimates rank the queries well "
                                             "enough that it costs an honest ranking at most 0.005 of NDCG@10, "
                                             "elsewhere chosen per round as tight as anchor_rank_cost allows.")
    anchor_rank_cost: float = Field(DEFAULT_RANK_COST, gt=0, lt=1, description="With anchor_kappa_query null, where "
                                    "the fixed guard is not kept: the largest expected NDCG@10 the defense may "
                                    "cost an honest round's top-10 ranking (all queries capped together).")
    seed: int | None = Field(None, ge=0, le=MAX_SEED,
                             description="Experiments only: reproducible randomness, no privacy. Leave out.")


class MeanParamsIn(_Schedule):
    """A mean round's parameters (ALGORITHM.md §11)."""

    epsilon: float = Field(gt=0, description="ε of every user.")
    lower: float = Field(ge=-1e75, le=1e75, description="Public lower bound of a value.")
    upper: float = Field(ge=-1e75, le=1e75, description="Public upper bound of a value (> lower).")
    sigma2: float | None = Field(None, ge=0, description="Known variance σ² of the values; null: estimated "
                                                         "privately from the opt-in group.")
    variance_share: float = Field(VARIANCE_SHARE, gt=0, lt=1, description="Share of the opt-in budget spent on "
                                                                          "σ² when it is not given.")
    defense: Literal[DEFENSES] = DEFENSE  # type: ignore[valid-type]  # the server's choices
    anchor_alpha: float = ANCHOR_ALPHA
    anchor_kappa: float = anchor_kappa(MEAN_DEFAULT_KAPPA)
    seed: int | None = Field(None, ge=0, le=MAX_SEED,
                             description="Experiments only: reproducible randomness, no privacy. Leave out.")


RETENTION = Field(DEFAULT_RETENTION_HOURS, gt=0, le=MAX_RETENTION_HOURS,
                  description="Hours after creation at which the round's raw opt-in data are purged, whatever "
                              "its state (a round still collecting opt-in data is then aborted).")


class BlenderRoundIn(_Strict):
    kind: Literal["blender"]
    name: Text | None = Field(None, max_length=200)
    params: BlenderParamsIn = Field(default_factory=BlenderParamsIn)
    retention_hours: float = RETENTION


class MeanRoundIn(_Strict):
    kind: Literal["mean"]
    name: Text | None = Field(None, max_length=200)
    params: MeanParamsIn
    retention_hours: float = RETENTION


CreateRoundIn = Annotated[BlenderRoundIn | MeanRoundIn, Field(discriminator="kind")]


class Counts(BaseModel):
    optin_users: int | None = Field(description="Enrolled opt-in users (administrators only; null otherwise).")
    optin_records: int | None = Field(description="Opt-in records (or values) uploaded (administrators only; "
                                                  "null otherwise).")
    messages: int = Field(description="Distinct device messages counted.")
    reports: int = Field(description="Reports in them.")


class RoundSeriesOut(BaseModel):
    id: str
    period: int | None = Field(None, description="From 1.")


class RoundOut(BaseModel):
    id: str
    kind: Literal["blender", "mean"]
    name: str | None
    state: STATES
    params: dict[str, Any]
    created: str
    headlist_hash: str | None
    counts: Counts
    non_private: bool = Field(False, description="A seeded (experiment) round: no privacy guarantee.")
    retention_deadline: str | None = Field(None, description="UTC time at which raw opt-in data are purged at the "
                                                             "latest.")
    raw_data_purged: str | None = Field(None, description="When the round's raw opt-in data were deleted.")
    warning: str | None = Field(None, description="Set for seeded (experiment) rounds, which have no privacy.")
    series: RoundSeriesOut | None = Field(None, description="The series the round is a period of (docs/SERIES.md).")


class RoundListOut(BaseModel):
    rounds: list[RoundOut]


class EnrolIn(_Strict):
    """One user (``user``) or several in order (``users``)."""

    user: Text | None = Field(None, min_length=1, max_length=MAX_TEXT,
                              description="The opt-in user's identifier (kept only as a salted HMAC pseudonym).")
    users: list[Annotated[Text, Field(min_length=1, max_length=MAX_TEXT)]] | None = Field(
        None, min_length=1, max_length=1_000_000, description="Several users, in order: one token each.")


class TokenOut(BaseModel):
    token: str = Field(description="The opt-in user's bearer token for this round (shown once).")


class TokensOut(BaseModel):
    tokens: list[str] = Field(description="One token per user, in the order given.")


class VocabularyIn(_Strict):
    queries: list[Text]
    urls: list[Text] = Field(default_factory=list)


class CloseIn(_Strict):
    flagged: Literal["hold", "publish", "remove"] = Field(
        "hold", description="What to do when the anchor check flags the results (docs/ALGORITHM.md §7.2): 'hold' "
        "(default) keeps them unpublished (state results-held) for an administrator to look at; 'publish' publishes "
        "them (flagged entries carry their opt-in estimates); 'remove' publishes them without the flagged entries.")


class PublishResultsIn(_Strict):
    flagged: Literal["keep", "remove"] = Field(
        "keep", description="'keep': publish the held results as they are (flagged entries carry their opt-in "
        "estimates); 'remove': publish them without the flagged entries.")


class PublishIn(_Strict):
    vocabulary: VocabularyIn | None = Field(None, description="Seeded (experiment) rounds only: the order of the "
                                                              "query and URL codes, to reproduce a simulation.")


class ReleaseOut(BaseModel):
    headlist: dict[str, Any]
    estimates: dict[str, Any]
    counts: list[int] | None = Field(description="Reports per head-list entry (null for a mean round).")
    messages: int
    duplicates: int


class OptinRecord(_Strict):
    query: Text = Field(min_length=1, max_length=MAX_TEXT)
    url: Text | None = Field(None, max_length=MAX_TEXT)


class OptinUploadIn(_Strict):
    """A BLENDER round takes ``records``; a mean round takes ``values``."""

    records: list[OptinRecord] | None = None
    values: list[Annotated[float, Field(ge=-1e300, le=1e300)]] | None = None
    upload_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
                                  description="Makes the upload idempotent: a repeat with the same id (or, without "
                                              "an id, the same records) is acknowledged and not stored again.")


class OptinBatchLine(OptinUploadIn):
    """One line of a batched (NDJSON) upload: a user's token and their records or values."""

    token: str = Field(min_length=1, max_length=1000)


OPTIN_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/OptinUploadIn"}},
        "application/x-ndjson": {"schema": {"type": "string", "description": "one line per opt-in user: "
                                            '{"token": ..., "records": [...]} or {"token": ..., "values": [...]}; '
                                            "each line is authenticated by its token (no Authorization header "
                                            "needed); all lines are stored in one transaction, or none"}},
    },
}


class AcceptedOut(BaseModel):
    accepted: int = Field(description="Records (or values) stored by this request.")
    duplicates: int = Field(0, description="Records of uploads stored before (a repeated upload): not stored again.")


class LedgerOut(BaseModel):
    """The service's privacy ledger: per-round totals and per-pseudonym spend (no identities)."""

    model_config = ConfigDict(extra="allow")


class ReportAckOut(BaseModel):
    acknowledged: int = Field(description="Messages in the request, all stored (now or before).")
    counted: int = Field(description="Messages new to the round.")
    duplicates: int = Field(description="Messages whose id was already stored (retries): not counted again.")


class HeadListOut(BaseModel):
    """The device document: hybriddp-headlist (BLENDER) or hybriddp-mean-round."""

    model_config = ConfigDict(extra="allow")
    format: str
    version: int
    content_hash: str


class LocalSearchUrl(BaseModel):
    url: str
    p: float


class LocalSearchQuery(BaseModel):
    query: str
    p: float
    urls: list[LocalSearchUrl]


class LocalSearchOut(BaseModel):
    round: str
    headlist: str
    queries: list[LocalSearchQuery]


_B64 = "URL-safe base64 without padding"


class TokenKeyOut(BaseModel):
    """A round's report-token key (docs/TOKENS.md)."""

    token_type: int = Field(description="2: Privacy Pass publicly verifiable token (RFC 9578 §6)")
    variant: str = Field(description="RFC 9474 variant: RSABSSA-SHA384-PSS-Deterministic")
    round: str
    public_key: str = Field(description=f"DER SubjectPublicKeyInfo, RSASSA-PSS OID (RFC 9578 §6.5); {_B64}")
    key_id: str = Field(description=f"SHA-256 of public_key; {_B64}")
    challenge: str = Field(description=f"the round's TokenChallenge (RFC 9578 §2.1); {_B64}")
    admission: Literal["tokens", "open"] = Field(description="'tokens': reports need a token; 'open': this server "
                                                             "takes reports without one (unsafe, demos only)")


class TokensIn(_Strict):
    blinded_msgs: list[Annotated[str, Field(max_length=400)]] = Field(
        min_length=1, max_length=10_000, description=f"blinded token inputs (RFC 9474 §4.2), 256 bytes each; {_B64}")


class TokenSigsOut(BaseModel):
    blind_sigs: list[str] = Field(description=f"the blind signatures, in order (RFC 9474 §4.3); {_B64}")
    key_id: str
    remaining: int = Field(description="tokens this credential may still get in this round")


class CredentialsIn(_Strict):
    count: int = Field(1, ge=1, le=10_000, description="how many credentials to make")
    tokens_per_round: int = Field(1, ge=1, le=10_000_000, description="report tokens each may get per round (a "
                                  "device sends one message a round; a relay for many devices needs more)")
    label: Annotated[str, Field(max_length=200, pattern=r"^[^\x00]*$")] | None = None


class CredentialOut(BaseModel):
    id: int
    label: str | None
    tokens_per_round: int
    created: str
    revoked: str | None


class NewCredentialOut(CredentialOut):
    credential: str = Field(description="the bearer secret: shown once, stored only as its SHA-256")


class CredentialListOut(BaseModel):
    credentials: list[CredentialOut]


class NewCredentialsOut(BaseModel):
    credentials: list[NewCredentialOut]


class HealthOut(BaseModel):
    status: Literal["ok"]


class ErrorDetail(BaseModel):
    code: str = Field(description="snake_case error code.")
    message: str = Field(description="What was wrong, the value, and the fix.")


class ErrorOut(BaseModel):
    error: ErrorDetail


_ID = {"type": "string", "pattern": f"^{ID_PATTERN}$", "description": "16 random bytes, URL-safe base64"}
_TOKEN = {"type": "string", "description": "the message's report token (docs/TOKENS.md): needed unless the server "
          "runs with --open-admission"}
_REPORT = {"type": "object", "required": ["query", "url"],
           "properties": {"query": {"type": ["string", "null"]}, "url": {"type": ["string", "null"]}}}
DEVICE_MESSAGE = {"type": "object", "title": "DeviceMessage", "required": ["id", "headlist", "reports"],
                  "properties": {"id": _ID, "headlist": {"type": "string"},
                                 "reports": {"type": "array", "items": _REPORT}, "token": _TOKEN}}
MEAN_MESSAGE = {"type": "object", "title": "MeanMessage", "required": ["id", "round", "value"],
                "properties": {"id": _ID, "round": {"type": "string"}, "value": {"type": "number"}, "token": _TOKEN}}
_ANY_MESSAGE = {"anyOf": [DEVICE_MESSAGE, MEAN_MESSAGE]}
REPORTS_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"anyOf": [DEVICE_MESSAGE, MEAN_MESSAGE,
                                                  {"type": "array", "items": _ANY_MESSAGE}]}},
        "application/x-ndjson": {"schema": {"type": "string", "description": "one message per line"}},
    },
}



# ----- round series (docs/SERIES.md) ------------------------------------------------------------------------------
class _SeriesIn(_Strict):
    name: Text | None = Field(None, max_length=200)
    period_seconds: float = Field(gt=0, le=366 * 86400, description="Length of a period in seconds (604800: weekly). "
                                  "It must leave at least 600 s after the opt-in window for token issuance and "
                                  "reports (else 422); when the round's issuance and report windows need more than "
                                  "nine tenths of that time they are shrunk to fit, and the answer's warnings say so.")
    optin_seconds: float | None = Field(None, gt=0, description="Each period's opt-in window from its start, in "
                                        "seconds; the head list is built when it ends. Default: half the period.")
    periods: int = Field(ge=1, le=1000, description="Number of periods.")
    start: datetime | None = Field(None, description="Start of the first period (ISO 8601; default: now).")
    flagged: Literal["hold", "publish", "remove"] = Field(
        "hold", description="What each period's close does when the anchor check flags its results (as a round's "
        "close).")
    retention_hours: float | None = Field(None, gt=0, description="Raw opt-in data of a period are purged this long "
                                          "after its round opens at the latest. Default: the period, at least 1 h.")
    first_round: str | None = Field(None, max_length=40, description="An existing round, still collecting opt-in "
                                    "data and with the series' parameters, that becomes period 1.")
    carry: int | None = Field(None, ge=0, le=1000, description="Periods a record the head list selected stays on the "
                              "next periods' lists, estimated from T (docs/ALGORITHM.md §13.1). Default: 4 for BLENDER "
                              "with the reuse or consistent estimator, else 0.")


class BlenderSeriesIn(_SeriesIn):
    kind: Literal["blender"]
    params: BlenderParamsIn = Field(default_factory=BlenderParamsIn)


class MeanSeriesIn(_SeriesIn):
    kind: Literal["mean"]
    params: MeanParamsIn


CreateSeriesIn = Annotated[BlenderSeriesIn | MeanSeriesIn, Field(discriminator="kind")]


class SeriesRoundOut(BaseModel):
    id: str
    state: STATES
    messages: int
    reports: int
    optin_users: int | None = Field(None, description="Administrators only.")


class SeriesPeriodOut(BaseModel):
    period: int = Field(description="From 1.")
    starts: str
    optin_until: str
    ends: str
    round: SeriesRoundOut | None
    note: str | None = None


class SeriesBudgetOut(BaseModel):
    lifetime_epsilon: float
    lifetime_delta: float
    round_epsilon: float
    round_delta: float
    periods_per_user: int = Field(description="Periods one opt-in user can take part in under the lifetime budget, "
                                  "by the ledger's rule (the tighter of basic composition and PLD accounting).")
    periods_per_user_basic: int = Field(description="The same by basic composition alone.")
    composition: Literal["basic", "pld"] = Field(description="Which accountant admits more periods.")


class SeriesOut(BaseModel):
    id: str
    kind: Literal["blender", "mean"]
    name: str | None
    params: dict[str, Any]
    start: str
    end: str
    period_seconds: float
    optin_seconds: float
    periods: int
    flagged: str
    retention_hours: float
    state: Literal["active", "ended", "cancelled"]
    created: str
    carry: int = Field(0, description="Periods a selected record stays on the next periods' head lists.")
    current_period: int | None = None
    periods_table: list[SeriesPeriodOut] = Field(default_factory=list)
    budget: SeriesBudgetOut | None = None
    actions: list[str] | None = Field(None, description="What this request did (advance).")
    warnings: list[str] = Field(default_factory=list, description="What is at risk in the schedule (nothing was "
                                "refused): e.g. the round's issuance and report windows do not fit after the opt-in "
                                "window and are shrunk every period.")


class SeriesListOut(BaseModel):
    series: list[SeriesOut]


class AdvanceIn(_Strict):
    step: bool = Field(False, description="Do the next action now whatever the clock says (publish the current "
                       "period's head list, close it, or open the next period); default: only what is due.")
