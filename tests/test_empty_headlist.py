"""Every run of the curator's mechanism is charged, whatever it outputs — an empty head list too.

An empty head list is an output of CreateHeadList (ALGORITHM.md §3.4). If it were free, a curator
could rerun until fresh noise lets a private record through the threshold; charging every run
bounds that by the lifetime budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clihelpers import assert_clean_error, invoke
from hybriddp.core.errors import EmptyHeadListError, HeadListError
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import ArrayVocabulary, RecordLog
from hybriddp.curator.party import curate

EPSILON = 4.0
DELTA = 1e-8  # tiny, so that no unique record survives in these tests (P ≤ δ/2 per record and run)
N_USERS = 200


def unique_records_log(path: Path, n_users: int = N_USERS) -> Path:
    """An opt-in log (CSV user,query,url) where every user has one record nobody else has."""
    lines = ["user,query,url"] + [f"u{i},private query {i},http://example.org/{i}" for i in range(n_users)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _headlist(tmp_path: Path, log: Path, attempt: int, *extra: object) -> object:
    return invoke("headlist", "--input", log, "--user-col", "user", "--url-col", "url",
                  "--epsilon", EPSILON, "--delta", DELTA, "-M", 10,
                  "--out-headlist", tmp_path / f"hl{attempt}.json", "--out-estimates", tmp_path / f"est{attempt}.json",
                  *extra, ok=False)


def test_retrying_the_curator_is_charged_every_time_until_the_budget_refuses(tmp_path: Path) -> None:
    """The retry attack on the file workflow: each run of `headlist --ledger` is charged, empty or not,
    so after lifetime/ε runs the next one is refused and the ledger has spent exactly runs × ε."""
    log = unique_records_log(tmp_path / "optin.csv")
    ledger = tmp_path / "ledger.db"
    lifetime = 3 * EPSILON
    attempts = 0
    for attempt in range(int(lifetime / EPSILON)):
        budget = ("--lifetime-epsilon", lifetime, "--lifetime-delta", 1e-3) if attempt == 0 else ()
        r = _headlist(tmp_path, log, attempt, "--ledger", ledger, "--round", f"try{attempt}", *budget)
        attempts += 1
        assert_clean_error(r, "kept no record", "charged", f"{N_USERS} opt-in users", str(ledger),
                           "running again is a new release, charged again")
        assert not (tmp_path / f"hl{attempt}.json").exists() and not (tmp_path / f"est{attempt}.json").exists()
    r = _headlist(tmp_path, log, 99, "--ledger", ledger, "--round", "one-too-many")
    assert_clean_error(r, "refused", "exceed the lifetime budget")
    assert "kept no record" not in r.stderr  # a refused run says nothing about its outcome
    rep = json.loads(invoke("privacy", "report", ledger, "--json").stdout)
    assert [x["round"] for x in rep["rounds"]] == [f"try{i}" for i in range(attempts)]
    assert rep["users"] == N_USERS
    assert sum(c["users"] for c in rep["cumulative"]) == N_USERS
    for c in rep["cumulative"]:  # every user, in S or T, paid ε for each run
        assert c["releases"] == attempts
        assert c["basic"]["epsilon"] == pytest.approx(attempts * EPSILON)
    assert rep["worst_basic_epsilon"] == pytest.approx(attempts * EPSILON) == pytest.approx(lifetime)


def test_empty_head_list_without_a_ledger_says_nothing_was_recorded(tmp_path: Path) -> None:
    log = unique_records_log(tmp_path / "optin.csv")
    (tmp_path / "hl0.json").write_text("earlier output", encoding="utf-8")
    r = _headlist(tmp_path, log, 0)
    assert_clean_error(r, "kept no record", "a release of the mechanism", "no --ledger was given",
                       "nothing was recorded")
    assert "\n" not in r.stderr.strip()
    assert (tmp_path / "hl0.json").read_text(encoding="utf-8") == "earlier output"  # earlier outputs stay
    assert not (tmp_path / "est0.json").exists()


def test_run_with_a_ledger_charges_an_empty_head_list_to_the_opt_in_users(tmp_path: Path) -> None:
    log = unique_records_log(tmp_path / "log.csv", 400)
    ledger = tmp_path / "ledger.db"
    r = invoke("run", "--input", log, "--user-col", "user", "--url-col", "url", "--epsilon", EPSILON,
               "--delta", DELTA, "--optin-fraction", 0.5, "-M", 10, "--ledger", ledger, "--round", "sim",
               "--lifetime-epsilon", 10, "--lifetime-delta", 1e-3, ok=False)
    assert_clean_error(r, "kept no record", "charged", "200 opt-in users", "running again is a new release")
    rep = json.loads(invoke("privacy", "report", ledger, "--json").stdout)
    groups = {g["group"]: g["users"] for g in rep["rounds"][0]["groups"]}
    assert set(groups) == {"optin-S", "optin-T"} and sum(groups.values()) == 200  # clients never reported


# ----- the library ------------------------------------------------------------------------------------------------

def _log(n_users: int) -> RecordLog:
    users = np.arange(n_users)
    return RecordLog.from_user_sorted(users, users.astype(np.int32), users.astype(np.int32),
                                      ArrayVocabulary(np.array([f"q{i}" for i in range(n_users)], dtype=object)),
                                      ArrayVocabulary(np.array([f"u{i}" for i in range(n_users)], dtype=object)),
                                      user_ids=np.array([f"user-{i}" for i in range(n_users)], dtype=object))


@pytest.mark.parametrize("seed", [None, 5])
def test_curate_raises_an_empty_head_list_error_carrying_the_runs_charges(seed: int | None) -> None:
    params = BlenderParams(epsilon=EPSILON, delta=DELTA, head_list_size=10)
    with pytest.raises(EmptyHeadListError) as info:
        curate(_log(N_USERS), params, seed=seed)
    exc = info.value
    assert isinstance(exc, HeadListError)
    by_group = {c.group: c for c in exc.charges}
    assert set(by_group) == {"optin-S", "optin-T"}
    s, t = by_group["optin-S"], by_group["optin-T"]
    assert (s.epsilon, s.delta, t.epsilon, t.delta) == (EPSILON, DELTA, EPSILON, 0.0)
    assert sorted([*s.users, *t.users]) == sorted(f"user-{i}" for i in range(N_USERS))
    assert len(s.users) == round(params.f_o * N_USERS)
    assert all(c.private == (seed is None) for c in exc.charges)
    assert exc.n_optin_users == N_USERS
    message = str(exc)
    # public parameters and the fix only: no count of sampled records (data-dependent)
    for needle in ("empty", "τ = ", f"ε = {EPSILON:g}", f"δ = {DELTA:g}", "m_O = 1", f"{N_USERS} opt-in users",
                   "more opt-in users", "--epsilon", "--delta", "--m-o"):
        assert needle in message, message
    assert "sampled" not in message and "\n" not in message
    with pytest.raises(EmptyHeadListError) as quiet:
        curate(_log(N_USERS), params, seed=seed, with_charges=False)
    assert quiet.value.charges == []
