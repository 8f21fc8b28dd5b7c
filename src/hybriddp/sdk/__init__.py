"""The HTTP SDK of the collection service (``hybriddp serve``), over httpx: the administrator, opt-in users,
relays and devices.

Three roles, one class each (paper Fig. 1; the API is in docs and ``/openapi.json``):

* :class:`AdminClient` (:mod:`.admin`) — the operator: create rounds, enrol opt-in users, publish the
  head list, close, fetch results (bearer admin token).
* :class:`OptinUploader` (:mod:`.optin`) — one opt-in user: upload raw records (or values) with the
  token the operator gave at enrolment. This is the only path raw data takes (:class:`OptinRelay`
  forwards many users' uploads in one request, each still authenticated by its own token).
* :class:`DeviceClient` (:mod:`.device`) — one device (a client in the paper): fetch and verify the
  head list (cached by its ETag), randomize its own records on the device with
  :func:`hybriddp.device.localalg.randomize_records` (charging its own
  :class:`~hybriddp.device.ledger.DeviceLedger`, by default the per-user one of
  :func:`hybriddp.device.ledger.default_device_ledger_path`), and submit the message.

One module per role, on the retrying HTTP core :mod:`.http`: idempotent requests are retried with
backoff (:class:`RetryPolicy`); a refusal is a :class:`ServiceRequestError` carrying the server's code
and message. :mod:`.client` re-exports every public name.
"""

from hybriddp.sdk.admin import AdminClient
from hybriddp.sdk.device import NO_LEDGER, Acknowledgement, DeviceClient, outbox_path
from hybriddp.sdk.http import (
    BodyTooLargeError,
    ConflictError,
    NotFoundError,
    RetryPolicy,
    ServiceRequestError,
    ServiceUnavailableError,
    UnauthorizedError,
    check_base_url,
)
from hybriddp.sdk.optin import OptinRelay, OptinUploader

__all__ = [
    "NO_LEDGER", "Acknowledgement", "AdminClient", "BodyTooLargeError", "ConflictError", "DeviceClient",
    "NotFoundError", "OptinRelay", "OptinUploader", "RetryPolicy", "ServiceRequestError", "ServiceUnavailableError",
    "UnauthorizedError", "check_base_url", "outbox_path",
]
