"""The devices (paper Fig. 1, Fig. 2 line 4; ALGORITHM.md §5).

* :func:`device_message` is one device: head-list document + its own records → one message
  (pure Python, :mod:`hybriddp.device.localalg`, OS randomness).
* :func:`simulate_devices` is millions of simulated devices at once (the vectorized batch
  randomizer, :mod:`hybriddp.device.batch`), returning report counts per head-list entry.
* :func:`log_messages` yields the messages of the devices of a log, either with OS randomness
  (one :func:`device_message` per device) or, for experiments with a seed, by replaying the batch
  randomizer's own uniforms through the device code, so the messages reproduce a simulation
  exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hybriddp.core.counting import CountingBackend, default_backend
from hybriddp.core.headlist import HeadList
from hybriddp.core.records import NO_URL, RecordLog, SampledRecords, sample_records
from hybriddp.core.reportlaw import LocalAlgParams
from hybriddp.core.rng import stage_rng
from hybriddp.device.batch import chunk_uniforms, randomize_batch
from hybriddp.device.ledger import DeviceLedger
from hybriddp.device.localalg import DeviceHeadList, RandomSource, UniformReplay, local_alg, randomize_records


def device_message(headlist: dict[str, Any] | DeviceHeadList, records: Sequence[tuple[str, str | None]], *,
                   source: RandomSource | None = None, ledger: DeviceLedger | None = None,
                   message_id: str | None = None) -> dict[str, Any]:
    """One device's message (ALGORITHM.md §5): see :func:`hybriddp.device.localalg.randomize_records`."""
    return randomize_records(headlist, records, source=source, ledger=ledger, message_id=message_id)


def sample_clients(log: RecordLog, client_users: np.ndarray, m_c: int, seed: int | None) -> SampledRecords:
    """D_C: ≤ m_C records per client, stream ``sample_clients``."""
    return sample_records(log, client_users, m_c, stage_rng(seed, "sample_clients"))


def simulate_devices(d_c: SampledRecords, hl: HeadList, lp: LocalAlgParams, *, seed: int | None,
                     backend: CountingBackend | None = None) -> np.ndarray:
    """Every client's LocalAlg (vectorized), then report counts per HL entry (Fig. 2 line 4)."""
    backend = backend or default_backend()
    reports = randomize_batch(hl.map_records(d_c.query, d_c.url), hl, lp, stage_rng(seed, "randomizer"))
    return backend.count_entries(reports, hl.n_entries)


def device_records(log: RecordLog, rows: np.ndarray) -> list[tuple[str, str | None]]:
    """The (query, URL) strings of the given rows of a log; URL None where there is none."""
    queries = log.queries.decode(log.query[rows])
    if not log.has_urls:
        return [(q, None) for q in queries]
    urls = log.urls.decode(log.url[rows])
    return [(q, None if uid == NO_URL else u)
            for q, u, uid in zip(queries, urls, log.url[rows].tolist(), strict=True)]


def seeded_message_id(seed: int, device: int) -> str:
    """A reproducible message id for seeded experiments (same shape as a random one)."""
    import base64

    digest = hashlib.blake2b(f"{seed}:{device}".encode(), digest_size=16, person=b"hybriddp-msg-id").digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def log_messages(log: RecordLog, devices: np.ndarray, headlist: dict[str, Any], *, seed: int | None = None,
                 ledger: DeviceLedger | None = None) -> Iterator[dict[str, Any]]:
    """The message of every device (user) in ``devices`` that has records.

    Without a seed each device samples and randomizes with OS randomness (production). With a
    seed the messages replay exactly what :func:`simulate_devices` draws for the same seed
    (experiments), with reproducible message ids; ``ledger`` is not used then.
    """
    dhl = DeviceHeadList.from_json(headlist)
    devices = np.asarray(devices, dtype=np.int64)
    if seed is None:
        off = log.user_offsets
        for user in devices.tolist():
            rows = np.arange(off[user], off[user + 1])
            if len(rows):
                yield device_message(dhl, device_records(log, rows), ledger=ledger)
        return
    d_c = sample_clients(log, devices, dhl.m_c, seed)
    uniforms = np.concatenate([np.empty((3, 0))] + [v for _, v in chunk_uniforms(
        stage_rng(seed, "randomizer"), len(d_c))], axis=1)
    records = device_records(log, d_c.rows)
    reports = [dhl.decode(*local_alg(*dhl.encode(*rec), dhl, UniformReplay(uniforms[:, i].tolist())))
               for i, rec in enumerate(records)]
    bounds = np.flatnonzero(np.diff(d_c.user)) + 1
    for chunk in np.split(np.arange(len(reports)), bounds):
        if len(chunk):
            user = int(d_c.user[chunk[0]])
            yield {"id": seeded_message_id(seed, user), "headlist": headlist["content_hash"],
                   "reports": [reports[i] for i in chunk.tolist()]}
