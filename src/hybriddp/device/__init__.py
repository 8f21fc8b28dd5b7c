"""The device (paper Fig. 1, Fig. 6): LocalAlg for one device with OS randomness and its own ledger
(:mod:`.localalg`, pure Python), the batch randomizer for simulations (:mod:`.batch`), the mean
device (:mod:`.mean`) and the device party (:mod:`.party`). ALGORITHM.md §5.

The names below are the device API (``from hybriddp.device import randomize_records``).
"""

from hybriddp.core.protocol import DeviceError, check_message_id, content_hash, new_message_id, validate_headlist
from hybriddp.device.ledger import DeviceLedger, DeviceLedgerRefusal, default_device_ledger_path, open_device_ledger
from hybriddp.device.localalg import (
    DeviceHeadList,
    RandomSource,
    SeededSource,
    SystemSource,
    local_alg,
    randomize_records,
)

__all__ = [
    "DeviceError", "DeviceHeadList", "DeviceLedger", "DeviceLedgerRefusal", "RandomSource", "SeededSource",
    "SystemSource", "check_message_id", "content_hash", "default_device_ledger_path", "local_alg",
    "new_message_id", "open_device_ledger", "randomize_records", "validate_headlist",
]
