"""A device without an outbox file (``DeviceClient(..., NO_LEDGER)``, or ``outbox=None``) still waits for its send
time: the message and its token are held by the client object until :meth:`DeviceClient.send_due` sends them
(docs/TOKENS.md "When a device reports"); before, such a message was reported as kept and never sent."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from test_api import ADMIN, PARAMS, blender_round
from test_tokens import counted, credentials

from hybriddp.core import tokens
from hybriddp.sdk import DeviceClient
from hybriddp.service import create_app
from hybriddp.service.demo import local_server

RECORDS = [("weather", "https://w.example/a")]


def test_a_device_without_an_outbox_file_holds_its_message_until_its_time(store_url: str) -> None:
    with TestClient(create_app(store_url, ADMIN)) as c, local_server(create_app(store_url, ADMIN)) as url:
        (cred,) = credentials(c)
        rid, hl = blender_round(c, {**PARAMS, "issuance_seconds": 600, "report_seconds": 1200})
        opens, closes = tokens.report_window(hl)
        now = [time.time()]
        dev = DeviceClient(url, rid, DeviceClient.NO_LEDGER, credential=cred, clock=lambda: now[0])
        assert dev.outbox is None
        ack = dev.participate(RECORDS, wait=False)
        assert ack.pending and opens <= ack.send_at <= closes and counted(c, rid) == 0
        again = dev.participate(RECORDS, wait=False)  # the same held message, not a second one
        assert again.pending and again.send_at == ack.send_at
        now[0] = ack.send_at + 1.0
        sent = dev.send_due()
        assert sent is not None and sent.counted == 1 and counted(c, rid) == 1
        assert dev.send_due() is None
