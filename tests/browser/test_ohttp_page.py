"""The JS device's Oblivious HTTP (clients/js/hybriddp-device.js ``ohttpFetch``: HPKE, OHTTP and binary HTTP on
Chromium's WebCrypto) against the service's own gateway (``POST /ohttp``, spec v2 §4): the head list and the token
key fetched through it are the ones served directly, and the gateway's key config is the head list's ``ohttp_key``.
A page on the service's own origin gains no privacy from its gateway (no relay in between): this checks the browser
side of the protocol, which a relay only forwards."""

from __future__ import annotations

from typing import Any

from browserhelpers import API, DemoServer

FETCH_THROUGH_GATEWAY = """async ([rid]) => {
  const m = await import('/static/hybriddp-device.js');
  const keys = await m.fetchOhttpKeys(fetch, '');
  const via = m.ohttpFetch('/ohttp', keys);
  const out = {keys};
  for (const tail of ['headlist', 'token-key', 'no-such-thing']) {
    const r = await via(`/api/v1/rounds/${encodeURIComponent(rid)}/${tail}`, {headers: {Accept: 'application/json'}});
    out[tail] = {status: r.status, body: await r.json().catch(() => null)};
  }
  const doc = out.headlist.body;
  try { m.checkOhttpKey(doc, via); out.committed = true; } catch (e) { out.committed = e.message; }
  return out;
}"""


def test_requests_through_the_gateway_from_the_page(demo: DemoServer, page: Any) -> None:
    rid = demo.collecting_round
    page.goto(demo.base_url + "/")
    page.wait_for_selector("body[data-loaded]")
    ohttp_posts: list[Any] = []
    page.on("request", lambda r: ohttp_posts.append(r) if r.url.endswith("/ohttp") else None)
    out = page.evaluate(FETCH_THROUGH_GATEWAY, [rid])
    direct = demo.get(f"{API}/rounds/{rid}/headlist")
    assert out["headlist"] == {"status": 200, "body": direct}
    assert out["token-key"] == {"status": 200, "body": demo.get(f"{API}/rounds/{rid}/token-key")}
    assert out["no-such-thing"]["status"] == 404
    assert out["committed"] is True or "ohttp_key" not in direct, out["committed"]
    assert [r.method for r in ohttp_posts] == ["POST"] * 3
    assert all(r.headers["content-type"] == "message/ohttp-req" for r in ohttp_posts)
