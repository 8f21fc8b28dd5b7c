"""Carried head lists (ALGORITHM.md §13.1, ``hybriddp.curator.carry``).

* The release with carried records is a function of the release without them and the carried (public) records:
  the same noisy S counts, the same selected records, the carried ones added without a count. So it is
  post-processing of CreateHeadList's (ε, δ)-DP output, checked exactly on every outcome of many seeded runs.
* A carried record's estimates (T's opt-in estimate, the blend) are unbiased and their reported variances match
  the spread, by Monte Carlo over a fixed log (expected values: the log's own frequencies).
* The carry rule: only records S selected are carried, for ``periods`` periods after their last selection.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybriddp.core.headlist import HeadList, record_keys
from hybriddp.core.noise import DiscreteLaplaceNoise
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import ArrayVocabulary, RecordLog
from hybriddp.core.rng import make_rng
from hybriddp.curator.carry import Carry, selected_records
from hybriddp.curator.mechanisms import create_head_list_with_counts
from hybriddp.simulation.pipeline import run_blender

N_USERS = 20_000
PROBS = [0.3, 0.2, 0.1, 0.05, 0.004]  # record i = (q{i}, u{i}); the rest of the users hold distinct tail records
CARRIED = 4  # p = 0.004: about 3.8 users of S's 950 hold it, under τ ≈ 6.6 at ε = 4, δ = 1e-5


def _log() -> RecordLog:
    rng = make_rng(20261127)
    record = rng.choice(len(PROBS) + 1, size=N_USERS, p=[*PROBS, 1 - sum(PROBS)])
    tail = record == len(PROBS)
    q = np.where(tail, len(PROBS) + np.arange(N_USERS), record).astype(np.int32)  # a tail record is its user's own
    users = np.arange(N_USERS)
    names = ArrayVocabulary(np.array([f"q{i}" for i in range(len(PROBS) + N_USERS)], dtype=object))
    urls = ArrayVocabulary(np.array([f"u{i}" for i in range(len(PROBS) + N_USERS)], dtype=object))
    return RecordLog.from_user_sorted(users, q, q.copy(), names, urls)


def test_records_rebuild_the_list_with_and_without_urls() -> None:
    hl = HeadList.from_lists([3, 7, 9], [[1, 4], [], [2]])
    q, u = hl.records()
    assert sorted(zip(q.tolist(), u.tolist(), strict=True)) == [(3, 1), (3, 4), (7, -1), (9, 2)]
    again = HeadList.from_records(q, u)
    for a, b in ((again.query_ids, hl.query_ids), (again.url_offsets, hl.url_offsets), (again.entry_url, hl.entry_url)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("seed", range(40))
def test_the_carried_release_is_the_plain_release_plus_the_public_records(seed: int) -> None:
    rng = make_rng(seed)
    q = rng.integers(0, 12, size=400)
    u = rng.integers(0, 3, size=400)
    carry = (np.array([2, 11, 30]), np.array([0, 2, 5]))  # one may be selected, one nobody holds
    kw = {"epsilon": 2.0, "delta": 1e-3, "m_o": 1}
    hl0, s0 = create_head_list_with_counts(q, u, noise=DiscreteLaplaceNoise(make_rng(seed + 1000)), **kw)
    hl1, s1 = create_head_list_with_counts(q, u, noise=DiscreteLaplaceNoise(make_rng(seed + 1000)), carry=carry, **kw)
    plain = dict(zip(record_keys(*hl0.records()).tolist(), s0[hl0.map_records(*hl0.records())].tolist(), strict=True))
    carried = dict(zip(record_keys(*hl1.records()).tolist(), s1[hl1.map_records(*hl1.records())].tolist(),
                       strict=True))
    assert set(carried) == set(plain) | set(record_keys(*carry).tolist())
    for k, x in carried.items():
        if k in plain:
            assert x == plain[k]  # the same released count
        else:
            assert math.isnan(x)  # carried only: no count released


def test_a_carried_records_estimates_are_unbiased_with_the_variance_they_report() -> None:
    log = _log()
    truth = float(np.mean(log.query == CARRIED))
    params = BlenderParams(epsilon=4.0, delta=1e-5, optin_fraction=0.05, f_o=0.95, head_list_size=10, project=False)
    carry = (np.array([CARRIED]), np.array([CARRIED]))
    rows = []
    for seed in range(300):
        run = run_blender(log, params, seed=seed, defense=None, carry=carry)
        rec = next(r for r in run.result().to_json()["records"] if r["query"] == f"q{CARRIED}" and not r["wildcard"])
        if selected_records(run.head_list, run.release.optin.reused).size == len(PROBS) - 1:  # S did not select it
            rows.append((rec["p_optin"], rec["var_optin"], rec["p_blended"], rec["var_blended"]))
    assert len(rows) >= 250  # the carried path, mostly
    a = np.array(rows)
    for est, var in ((a[:, 0], a[:, 1]), (a[:, 2], a[:, 3])):
        z = (est.mean() - truth) / math.sqrt(est.var(ddof=1) / len(est))
        assert abs(z) < 5.0, (est.mean(), truth, z)
        ratio = est.var(ddof=1) / var.mean()
        assert 0.75 < ratio < 1.33, ratio


def test_only_selected_records_are_carried_and_for_the_given_periods() -> None:
    c = Carry(2)
    c.update(0, record_keys(np.array([1, 2]), np.array([0, 0])))
    assert sorted(zip(*(x.tolist() for x in c.records(1)), strict=True)) == [(1, 0), (2, 0)]
    c.update(1, record_keys(np.array([2]), np.array([0])))  # 2 selected again; 1 only carried
    assert sorted(zip(*(x.tolist() for x in c.records(2)), strict=True)) == [(1, 0), (2, 0)]
    assert sorted(zip(*(x.tolist() for x in c.records(3)), strict=True)) == [(2, 0)]  # 1: three periods ago
    assert c.records(4) is None
    assert Carry(0).records(1) is None
    with pytest.raises(ValueError, match="releases S's counts"):
        selected_records(HeadList.from_lists([1], [[0]]), None)
    with pytest.raises(Exception, match="carry"):
        Carry(-1)
