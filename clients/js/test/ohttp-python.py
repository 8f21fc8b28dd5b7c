"""The Python side of clients/js/test/ohttp.test.js: hybriddp.core.ohttp / bhttp as the gateway.

stdin: one JSON job; stdout: one JSON answer (bytes as hex).
  {"op": "key"} → {"config": b64url KeyConfig, "key": hex of GatewayKey.to_bytes(), "keys": hex application/ohttp-keys}
  {"op": "serve", "key", "enc_request", "status", "headers", "content"} → {"request": {method, scheme, authority,
      path, headers, content (hex)}, "enc_response"}: decapsulates what JS sealed, seals the given response
"""

import json
import sys

from hybriddp.core import bhttp, ohttp, tokens

job = json.load(sys.stdin)
if job["op"] == "key":
    key = ohttp.GatewayKey.generate(key_id=int(job.get("key_id", 1)))
    print(json.dumps({"config": tokens.b64(key.config.to_bytes()), "key": key.to_bytes().hex(),
                      "keys": ohttp.encode_key_configs([key.config]).hex()}))
else:
    key = ohttp.GatewayKey.from_bytes(bytes.fromhex(job["key"]))
    try:
        raw, ctx = ohttp.decapsulate_request(key, bytes.fromhex(job["enc_request"]))
    except ohttp.OHTTPError as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(0)
    req = bhttp.decode_request(raw)
    response = bhttp.encode_response(job["status"], [tuple(h) for h in job["headers"]], bytes.fromhex(job["content"]))
    print(json.dumps({"request": {"method": req.method, "scheme": req.scheme, "authority": req.authority,
                                  "path": req.path, "headers": [list(h) for h in req.headers],
                                  "content": req.content.hex()},
                      "enc_response": ctx.seal_response(response).hex()}))
