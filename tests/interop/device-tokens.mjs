// hybriddp's JS device (clients/js/hybriddp-device.js) as the client and @cloudflare/blindrsa-ts as the signer
// and verifier, for tests/test_blindrsa_interop.py (protocol v2). stdin: {key_doc, headlist ({token_key}: the
// commitment), round, pkcs8 (hex), spki (hex, rsaEncryption OID)}; prints JSON: the blinded message and the token
// (base64url Token struct), the token input (hex), the message id its nonce gives, the TS verdict on the token's
// authenticator and on a tampered one, and the device's error on a tampered blind signature.
import { readFileSync } from "node:fs";

import { RSABSSA } from "@cloudflare/blindrsa-ts";

import { parseToken, parseTokenKey, requestToken } from "../../clients/js/hybriddp-device.js";

const job = JSON.parse(readFileSync(0, "utf8"));
const suite = RSABSSA.SHA384.PSS.Deterministic();
const bytes = (h) => Uint8Array.from(Buffer.from(h, "hex"));
const b64 = (b) => Buffer.from(b).toString("base64url");
const unb64 = (t) => Uint8Array.from(Buffer.from(t, "base64url"));
const algo = { name: "RSA-PSS", hash: "SHA-384" };
const pub = await crypto.subtle.importKey("spki", bytes(job.spki), algo, true, ["verify"]);
const priv = await crypto.subtle.importKey("pkcs8", bytes(job.pkcs8), algo, true, ["sign"]);

const key = await parseTokenKey(job.key_doc, job.round, job.headlist);
const req = await requestToken(key, job.round);
const blindSig = await suite.blindSign(priv, unb64(req.blinded)); // the TS signer, RFC 9474 §4.3
const token = await req.finalize(b64(blindSig));
const tampered = Uint8Array.from(blindSig);
tampered[7] ^= 0x10;
let tamperedError = null;
try {
  await req.finalize(b64(tampered));
} catch (exc) {
  tamperedError = `${exc.name}: ${exc.message}`;
}
const { authenticator } = parseToken(token);
const badToken = Uint8Array.from(authenticator);
badToken[200] ^= 1;
console.log(JSON.stringify({
  blinded: req.blinded,
  token,
  token_input: Buffer.from(req.tokenInput).toString("hex"),
  message_id: req.messageId,
  ts_valid: await suite.verify(pub, authenticator, req.tokenInput),
  ts_valid_tampered: await suite.verify(pub, badToken, req.tokenInput),
  tampered_error: tamperedError,
}));
