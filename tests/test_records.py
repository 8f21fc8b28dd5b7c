"""Per-user sampling of ≤ m records without replacement (ALGORITHM.md §1): records.sample_per_user and
records.sample_records.

Uniformity is checked with chi-square tests on *which subset* a user gets (not only the
marginal inclusion rates, which a biased subset sampler could still match), seeded, p > 1e-6.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from hybriddp.core.records import ArrayVocabulary, RecordLog, sample_per_user, sample_records

# ----- helpers ---------------------------------------------------------------------------------

SIZES = [0, 1, 2, 3, 5, 7]  # records per user, repeated; includes users with 0 and with < m records
REPEATS = 8000
P_MIN = 1e-6


def offsets_for(sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def split_by_user(rows: np.ndarray, offsets: np.ndarray, users: np.ndarray, m: int) -> list[np.ndarray]:
    """The output rows of each user, in the order of ``users`` (each takes min(m, count))."""
    take = np.minimum(np.diff(offsets)[users], m)
    bounds = np.concatenate([[0], np.cumsum(take)])
    assert bounds[-1] == len(rows)
    return [rows[bounds[i]:bounds[i + 1]] for i in range(len(users))]


def subset_pvalue(subsets: list[tuple[int, ...]], size: int, m: int) -> float:
    """Chi-square p-value of the observed m-subsets of range(size) against uniform."""
    cells = {c: 0 for c in itertools.combinations(range(size), m)}
    for s in subsets:
        cells[s] += 1
    obs = np.array(list(cells.values()))
    return float(stats.chisquare(obs).pvalue)


# ----- sample_per_user --------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 2, 3])
def test_sample_per_user_uniform_subsets(m: int) -> None:
    """8000 users of each size 0, 1, 2, 3, 5, 7; expected counts per subset cell ≥ 8000/35 ≈ 229."""
    sizes = SIZES * REPEATS
    offsets = offsets_for(sizes)
    users = np.arange(len(sizes))
    rows = sample_per_user(offsets, users, m, np.random.default_rng(1000 + m))
    per_user = split_by_user(rows, offsets, users, m)
    by_size: dict[int, list[tuple[int, ...]]] = {s: [] for s in SIZES}
    for user, r in zip(users.tolist(), per_user, strict=True):
        s = sizes[user]
        local = r - offsets[user]
        assert np.all((local >= 0) & (local < s))  # inside the user's own records
        assert len(set(local.tolist())) == len(local) == min(m, s)  # no duplicates
        by_size[s].append(tuple(sorted(local.tolist())))
    assert by_size[0] == [()] * REPEATS  # users with no records contribute nothing
    for s in SIZES:
        if 0 < s <= m:  # all records taken
            assert set(by_size[s]) == {tuple(range(s))}
        elif s > m:
            assert subset_pvalue(by_size[s], s, m) > P_MIN, (s, m)


def test_subset_test_has_power() -> None:
    """A sampler that takes the first record plus m−1 random others is caught by the same test."""
    rng = np.random.default_rng(5)
    biased = [tuple(sorted([0, *(1 + rng.choice(6, 2, replace=False)).tolist()])) for _ in range(REPEATS)]
    assert subset_pvalue(biased, 7, 3) < P_MIN


@pytest.mark.parametrize("m", [1, 3])
def test_sample_per_user_follows_the_given_user_order(m: int) -> None:
    sizes = [4, 0, 1, 6, 2, 3]
    offsets = offsets_for(sizes)
    users = np.array([3, 0, 5, 1, 2, 4, 3])  # any order, repeats allowed
    rows = sample_per_user(offsets, users, m, np.random.default_rng(0))
    for user, r in zip(users.tolist(), split_by_user(rows, offsets, users, m), strict=True):
        assert np.all((r >= offsets[user]) & (r < offsets[user + 1]))
        assert len(r) == min(m, sizes[user])


def test_sample_per_user_m1_marginal_is_uniform() -> None:
    """m = 1 fast path: position within a user of 5 records ~ uniform (also covered above)."""
    offsets = offsets_for([5] * 50_000)
    rows = sample_per_user(offsets, np.arange(50_000), 1, np.random.default_rng(8))
    pos = rows - offsets[:-1]
    assert stats.chisquare(np.bincount(pos, minlength=5)).pvalue > P_MIN


def test_sample_per_user_empty() -> None:
    offsets = offsets_for([0, 0, 3])
    assert sample_per_user(offsets, np.array([], dtype=np.int64), 2, np.random.default_rng(0)).size == 0
    assert sample_per_user(offsets, np.array([0, 1]), 1, np.random.default_rng(0)).size == 0
    assert sample_per_user(offsets, np.array([0, 1]), 3, np.random.default_rng(0)).size == 0


# ----- sample_records -----------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 2, 4])
def test_sample_records_owner_and_rows_consistent(m: int) -> None:
    rng = np.random.default_rng(42 + m)
    sizes = rng.integers(0, 6, 300)
    offsets = offsets_for(sizes.tolist())
    n = int(offsets[-1])
    log = RecordLog(offsets, rng.integers(0, 50, n).astype(np.int32), rng.integers(-1, 80, n).astype(np.int32),
                    ArrayVocabulary([f"q{i}" for i in range(50)]), ArrayVocabulary([f"u{i}" for i in range(80)]))
    users = rng.permutation(300)[:200]
    d = sample_records(log, users, m, rng)
    assert len(d) == int(np.minimum(sizes[users], m).sum())
    np.testing.assert_array_equal(d.query, log.query[d.rows])
    np.testing.assert_array_equal(d.url, log.url[d.rows])
    assert np.all((d.rows >= offsets[d.user]) & (d.rows < offsets[d.user + 1]))
    expected_owner = np.repeat(users, np.minimum(sizes[users], m))  # follows the order of users
    np.testing.assert_array_equal(d.user, expected_owner)
    assert len(np.unique(d.rows)) == len(d.rows)  # no record twice (users are distinct)
    assert math.isclose(len(d) / max(len(users), 1), np.minimum(sizes[users], m).mean())
