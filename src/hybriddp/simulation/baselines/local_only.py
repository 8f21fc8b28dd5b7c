"""The ``local-only`` baseline: heavy hitters with no opt-in group at all.

BLENDER needs a small opt-in group to build its head list (paper Fig. 2 line 2). Without one,
a purely local-DP system must *discover* the heavy records from randomized reports too; this
is the setting of Qin et al.'s LDPMiner (CCS 2016), which the paper compares with in §4.2.2
and §5 (NDCG ≈ 0.3 at AOL scale against BLENDER's > 0.95). The discovery stage here is the
stronger successor of LDPMiner's: PEM over OLH (Wang, Li, Jha, IEEE TDSC 2019;
:mod:`hybriddp.simulation.baselines.pem`). The estimation stage is BLENDER's own client algorithm, so the
comparison with BLENDER isolates what the opt-in group buys:

1. every user samples ≤ m_C records (ALGORITHM.md §1; stream ``sample_clients``);
2. a random ``discovery_fraction`` of the users (stream ``local_split``) runs PEM: each one
   reports one of its sampled records (chosen uniformly) through OLH — the top M records
   (M = ``head_list_size``) form the head list, wildcards added (stream ``local_discovery``);
3. the other users run LocalAlg over that head list (paper Fig. 6, ALGORITHM.md §5; stream
   ``randomizer``) and EstimateClientProbabilities (paper Fig. 5, ALGORITHM.md §6) gives p̂ for every
   entry and every query — the two-stage (query, then URL) estimation of BLENDER's clients.

Item coding
-----------
PEM works on fixed-length bit strings. Two codings:

* ``item_bits=None`` (the default, *dictionary*): the distinct records of the data are numbered
  densely onto ``L = ⌈log₂ #distinct⌉`` bits and PEM is told the domain size: the aggregator is
  assumed to hold a dictionary of exactly the records that exist (a search engine knows its
  queries and URLs). This is the strongest local-only baseline: it knows the support of the data.
* ``item_bits`` set (e.g. 32, *no dictionary*): a device hashes its ⟨query, URL⟩ record to
  ``item_bits`` bits with a public hash — the top bits of a fixed 64-bit mixing permutation
  (splitmix64's finalizer) of the record key (:func:`hybriddp.core.headlist.record_keys`) — and PEM
  runs over the whole 2^item_bits domain: the aggregator knows nothing about which records exist.
  PEM's top M codes are the head list *as they are*: a code that no record has is a false
  discovery the aggregator cannot tell apart, so it stays in the list as a placeholder record
  (query and URL ids past the end of the vocabularies, named ``<no record k>``) whose true
  frequency is 0. The list therefore always has M records, like BLENDER's, and false discoveries
  cost what they cost in the metrics. (Naming a real discovered code uses the records' dictionary:
  a simulation convenience; a deployment would encode the strings themselves, which only lengthens
  the codes. Colliding records, ~n²/2^33 of them, merge.)

On the aol preset with M = 10 the dictionary coding gives NDCG@10 ≈ 0.38 at ε = 1 and 0.97 at
ε = 5; the dictionary-free coding is far lower (docs/results). The mixing matters in both: the
synthetic generator gives popular queries small ids. Logs without a URL level code queries alone.

Privacy
-------
Every user is in exactly one of the two groups. A discovery user sends one OLH report, which
is ε-LDP (Wang et al. 2017, OLH); an estimation user sends LocalAlg reports with the
(ε, δ) of ``params`` (paper Theorem 3). By parallel composition over disjoint users every
user is (ε, δ)-LDP — ε-LDP for the discovery users. No user trusts a curator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybriddp.core.errors import parameter_error
from hybriddp.core.headlist import HeadList, record_keys, split_keys
from hybriddp.core.params import BlenderParams
from hybriddp.core.records import NO_URL, RecordLog, SampledRecords, sample_records
from hybriddp.core.reportlaw import LocalAlgParams
from hybriddp.core.rng import stage_rng
from hybriddp.core.stages import Stages
from hybriddp.curator.party import client_f_c
from hybriddp.device.batch import randomize_batch
from hybriddp.server.blend import project_to_simplex
from hybriddp.server.client_estimates import ClientEstimates, estimate_client_probabilities
from hybriddp.simulation.baselines.pem import pem


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fixed bijection of 64-bit integers (a public hash)."""
    z = np.asarray(x).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@dataclass
class ItemCoding:
    """A collision-free public hash of records onto ``n_bits``-bit integers (see module doc).

    Attributes
    ----------
    sorted_keys : int64 array, the distinct record keys, sorted.
    code_of_sorted : int64 array, code of each of ``sorted_keys``.
    key_of_code : int64 array, record key of each code.
    n_bits : int, L.
    url_level : bool, False when records are coded by their query alone.
    """

    sorted_keys: np.ndarray
    code_of_sorted: np.ndarray
    key_of_code: np.ndarray
    n_bits: int
    url_level: bool

    hashed: bool = False  # True: codes are item_bits-bit hashes over the whole domain

    @classmethod
    def build(cls, query: np.ndarray, url: np.ndarray, url_level: bool = True,
              item_bits: int | None = None) -> ItemCoding:
        """Code the distinct records of (query, url).

        ``item_bits`` given: code = the top ``item_bits`` bits of :func:`mix64` of the key (a public
        hash over the whole domain). None: number them densely in the order of :func:`mix64`
        (oracle coding, see the module docstring).
        """
        keys = np.unique(cls._keys(query, url, url_level))
        if item_bits is not None:
            if not 1 <= item_bits <= 32:
                raise parameter_error("item_bits", item_bits, "an integer in [1, 32]")
            code = (mix64(keys) >> np.uint64(64 - item_bits)).astype(np.int64)
            order = np.argsort(code, kind="stable")
            return cls(keys, code, keys[order], item_bits, url_level, True)
        order = np.argsort(mix64(keys), kind="stable")
        code = np.empty(len(keys), dtype=np.int64)
        code[order] = np.arange(len(keys), dtype=np.int64)
        n_bits = max(1, int(np.ceil(np.log2(max(len(keys), 2)))))
        return cls(keys, code, keys[order], n_bits, url_level)

    @staticmethod
    def _keys(query: np.ndarray, url: np.ndarray, url_level: bool) -> np.ndarray:
        url = np.asarray(url) if url_level else np.full(len(query), NO_URL, dtype=np.int64)
        return record_keys(query, url)

    @property
    def n_items(self) -> int:
        """Number of coded records (oracle coding: codes ``n_items .. 2^n_bits − 1`` are unused)."""
        return len(self.sorted_keys)

    def encode(self, query: np.ndarray, url: np.ndarray) -> np.ndarray:
        """Codes of records that were in the coded set."""
        keys = self._keys(query, url, self.url_level)
        return self.code_of_sorted[np.searchsorted(self.sorted_keys, keys)]

    def decode(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query ids, URL ids) of codes (URL :data:`~hybriddp.core.records.NO_URL` without a URL level).

        Hashed coding: a code no record hashes to decodes to the nearest coded record's key only
        if equal; unmatched codes are dropped by :meth:`known`.
        """
        codes = np.asarray(codes, dtype=np.int64)
        if self.hashed:
            sorted_codes = np.sort(self.code_of_sorted)
            i = np.minimum(np.searchsorted(sorted_codes, codes), len(sorted_codes) - 1)
            return split_keys(self.key_of_code[i])
        return split_keys(self.key_of_code[codes])

    def known(self, codes: np.ndarray) -> np.ndarray:
        """Mask of codes that some record has (always true for the oracle coding)."""
        codes = np.asarray(codes, dtype=np.int64)
        if not self.hashed:
            return np.ones(len(codes), dtype=bool)
        return np.isin(codes, self.code_of_sorted)


@dataclass
class LocalOnlyOutput:
    """What the local-only baseline computed.

    Attributes
    ----------
    head_list : the head list of the PEM-discovered records (≤ M records, wildcards added).
    p_record : client estimate per head-list entry, projected onto the simplex if
        ``params.project``.
    p_record_raw : the unprojected client estimates.
    p_query : direct client estimate per query position (``*`` included).
    sampled : all users' sampled records (≤ m_C each), the ground truth of the metrics.
    sizes : users in each phase, reports, PEM rounds, discovered records, ...
    client : the full client estimates (variances included).
    """

    head_list: HeadList
    p_record: np.ndarray
    p_record_raw: np.ndarray
    p_query: np.ndarray
    sampled: SampledRecords
    sizes: dict[str, int]
    client: ClientEstimates | None = None


def placeholder_ids(n_queries: int, n_urls: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Query and URL ids of ``n`` placeholder records: ids past the end of the vocabularies.

    They stand for discovered codes no record has; no user holds them, so their true frequency
    is 0, and :func:`hybriddp.server.result.decode_or_placeholder` names them ``<no record k>``.
    """
    return (np.arange(n, dtype=np.int64) + n_queries, np.arange(n, dtype=np.int64) + n_urls)


def _one_record_per_user(sampled: SampledRecords, users: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Row (in ``sampled``) of one uniformly chosen sampled record of each user that has one."""
    start = np.searchsorted(sampled.user, users, side="left")
    count = np.searchsorted(sampled.user, users, side="right") - start
    pick = start + (rng.random(len(users)) * count).astype(np.int64)
    return pick[count > 0]


def run_local_only(log: RecordLog, params: BlenderParams, *, seed: int | None,
                   discovery_fraction: float = 0.5, stages: Stages | None = None,
                   eta: int | None = None, gamma: int | None = None, item_bits: int | None = None) -> LocalOnlyOutput:
    """Simulate the local-only baseline on a log (module docstring).

    Parameters
    ----------
    log : the users' records.
    params : ε, δ, f_C, m_C, M (= ``head_list_size``) and ``project`` are used; the opt-in
        parameters are not.
    seed : reproducible experiments only (no privacy); None draws from the OS.
    discovery_fraction : share of the users that run PEM (the rest run LocalAlg).
    stages : wall-time recorder.
    eta, gamma : PEM's bits added per round and start length (round 1 reports γ + η bits;
        defaults in :mod:`hybriddp.simulation.baselines.pem`).
    item_bits : None (default) numbers the existing records densely, as an aggregator with a
        dictionary of the records would; an integer (e.g. 32) hashes records over the whole
        2^item_bits domain with no dictionary, and discovered codes no record has stay in the
        list as placeholder records of true frequency 0 (module docstring).
    """
    if not (isinstance(discovery_fraction, (int, float)) and 0.0 < discovery_fraction < 1.0):
        raise parameter_error("discovery_fraction", discovery_fraction, "strictly between 0 and 1")
    stages = stages or Stages()
    n_users = log.n_users
    with stages.stage("sample records"):
        sampled = sample_records(log, np.arange(n_users, dtype=np.int64), params.m_c,
                                 stage_rng(seed, "sample_clients"))
    with stages.stage("split users"):
        perm = stage_rng(seed, "local_split").permutation(n_users)
        n_disc = round(discovery_fraction * n_users)
        discovery = np.sort(perm[:n_disc])
        is_estimation = np.ones(n_users, dtype=bool)
        is_estimation[discovery] = False
    with stages.stage("PEM discovery"):
        rng = stage_rng(seed, "local_discovery")
        coding = ItemCoding.build(sampled.query, sampled.url, log.has_urls, item_bits)
        rows = _one_record_per_user(sampled, discovery, rng)
        values = coding.encode(sampled.query[rows], sampled.url[rows])
        found = pem(values, coding.n_bits, params.epsilon, rng, k=params.head_list_size, eta=eta, gamma=gamma,
                    domain_size=None if coding.hashed else coding.n_items)
        items = found.items
        q, u = coding.decode(items)
        if not log.has_urls:
            u = np.full(len(q), NO_URL, dtype=np.int64)
        unknown = ~coding.known(items)  # false discoveries (dictionary-free coding only)
        placeholder_q, placeholder_u = placeholder_ids(len(log.queries), len(log.urls), int(unknown.sum()))
        q[unknown] = placeholder_q
        if log.has_urls:
            u[unknown] = placeholder_u
        hl = HeadList.from_records(q, u)
    with stages.stage("randomize clients"):
        lp = LocalAlgParams.build(hl, params.epsilon, params.delta, client_f_c(params, log.has_urls), params.m_c)
        est_rows = is_estimation[sampled.user]
        entries = hl.map_records(sampled.query[est_rows], sampled.url[est_rows])
        reports = randomize_batch(entries, hl, lp, stage_rng(seed, "randomizer"))
        counts = np.bincount(reports, minlength=hl.n_entries)
    with stages.stage("estimate client probabilities"):
        client = estimate_client_probabilities(counts, hl, lp, params.m_c)
        p_raw = client.p_record
        p_record = project_to_simplex(p_raw) if params.project else p_raw.copy()
    sizes = {
        "users": n_users,
        "discovery_users": int(n_disc),
        "estimation_users": int(n_users - n_disc),
        "sampled_records": len(sampled),
        "discovery_reports": len(values),
        "estimation_records": int(est_rows.sum()),
        "item_bits": coding.n_bits,
        "distinct_items": coding.n_items,
        "pem_rounds": found.n_rounds,
        "pem_eta": found.eta,
        "pem_first_bits": found.prefix_bits[0],
        "pem_users_per_round": min(found.users_per_round),
        "pem_max_candidates": max(found.candidates_per_round),
        "discovered_records": len(items),
        "false_discoveries": int(unknown.sum()),
        "head_list_records": hl.n_records,
        "head_list_queries": hl.n_queries,
    }
    return LocalOnlyOutput(hl, p_record, p_raw, client.p_query, sampled, sizes, client)
