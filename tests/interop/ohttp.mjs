// Oblivious HTTP (RFC 9458) request/response encapsulation, both sides, on @hpke/core and WebCrypto, for
// tests/test_ohttp_interop.py. Written from the RFC only: it shares no code with hybriddp.core.ohttp.
// stdin: a JSON array of jobs; stdout: a JSON array of results, one per job, bytes as hex. Jobs:
//   {"op": "encapsulate", "keys": application/ohttp-keys, "request"} → {"enc_request", "secret", "enc", "key_id"}
//   {"op": "open", "secret", "enc", "enc_response"} → {"response"}
//   {"op": "decapsulate", "sk": 32-byte scalar, "key_id", "enc_request", "response"} → {"request", "enc_response"}
// A job that fails gives {"error": "<error name>: <message>"}.
import { Aes128Gcm, CipherSuite, DhkemP256HkdfSha256, HkdfSha256 } from "@hpke/core";

const suite = new CipherSuite({ kem: new DhkemP256HkdfSha256(), kdf: new HkdfSha256(), aead: new Aes128Gcm() });
const KEM = 0x0010, KDF = 0x0001, AEAD = 0x0001, NPK = 65, NENC = 65, NK = 16, NN = 12;
const RESPONSE_NONCE_LEN = Math.max(NN, NK);
const utf8 = new TextEncoder();
const hex = (b) => Buffer.from(new Uint8Array(b)).toString("hex");
const bytes = (h) => Uint8Array.from(Buffer.from(h, "hex"));
const cat = (...parts) => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
};
const u16 = (b, at) => (b[at] << 8) | b[at + 1];

// RFC 9458 §3.2: length (2) || KeyConfig, repeated; §3.1: key_id, kem_id, public key, symmetric suites.
function parseKeys(body) {
  const configs = [];
  for (let at = 0; at < body.length;) {
    const n = u16(body, at);
    const c = body.subarray(at + 2, at + 2 + n);
    if (c.length !== n) throw new Error("truncated application/ohttp-keys");
    at += 2 + n;
    if (u16(c, 1) !== KEM) continue;
    const suitesLen = u16(c, 3 + NPK);
    if (suitesLen !== c.length - 5 - NPK || suitesLen % 4) throw new Error("bad symmetric suites length");
    const suites = [];
    for (let i = 5 + NPK; i < c.length; i += 4) suites.push([u16(c, i), u16(c, i + 2)]);
    if (suites.some(([k, a]) => k === KDF && a === AEAD)) configs.push({ keyId: c[0], publicKey: c.subarray(3, 3 + NPK) });
  }
  if (configs.length === 0) throw new Error("no usable key config");
  return configs[0];
}

const header = (keyId) => new Uint8Array([keyId, KEM >> 8, KEM & 255, KDF >> 8, KDF & 255, AEAD >> 8, AEAD & 255]);
const info = (hdr) => cat(utf8.encode("message/bhttp request"), new Uint8Array([0]), hdr); // §4.3

// §4.4: prk = Extract(enc || response_nonce, secret); key = Expand(prk, "key", Nk); nonce = Expand(prk, "nonce", Nn).
// WebCrypto's HKDF is Extract-then-Expand, exactly these two steps.
async function responseKeys(secret, enc, responseNonce) {
  const ikm = await crypto.subtle.importKey("raw", secret, "HKDF", false, ["deriveBits"]);
  const salt = cat(enc, responseNonce);
  const derive = async (label, n) => new Uint8Array(await crypto.subtle.deriveBits(
    { name: "HKDF", hash: "SHA-256", salt, info: utf8.encode(label) }, ikm, 8 * n));
  return { aead: suite.aead.createEncryptionContext(await derive("key", NK)), nonce: await derive("nonce", NN) };
}

async function encapsulate({ keys, request }) { // the client, §4.3
  const config = parseKeys(bytes(keys));
  const hdr = header(config.keyId);
  const recipientPublicKey = await suite.kem.deserializePublicKey(config.publicKey);
  const sender = await suite.createSenderContext({ recipientPublicKey, info: info(hdr) });
  const ct = new Uint8Array(await sender.seal(bytes(request), new Uint8Array(0)));
  const enc = new Uint8Array(sender.enc);
  const secret = await sender.export(utf8.encode("message/bhttp response"), RESPONSE_NONCE_LEN);
  return { enc_request: hex(cat(hdr, enc, ct)), secret: hex(secret), enc: hex(enc), key_id: config.keyId };
}

async function open({ secret, enc, enc_response }) { // the client, §4.4
  const body = bytes(enc_response);
  const { aead, nonce } = await responseKeys(bytes(secret), bytes(enc), body.subarray(0, RESPONSE_NONCE_LEN));
  return { response: hex(await aead.open(nonce, body.subarray(RESPONSE_NONCE_LEN), new Uint8Array(0))) };
}

async function decapsulate({ sk, key_id, enc_request, response }) { // the gateway, §4.3 and §4.4
  const msg = bytes(enc_request);
  const hdr = msg.subarray(0, 7);
  if (hex(hdr) !== hex(header(key_id))) throw new Error(`unknown key id or suite ${hex(hdr)}`);
  const enc = msg.subarray(7, 7 + NENC);
  const recipientKey = await suite.kem.deserializePrivateKey(bytes(sk));
  const recipient = await suite.createRecipientContext({ recipientKey, enc, info: info(hdr) });
  const request = await recipient.open(msg.subarray(7 + NENC), new Uint8Array(0));
  const secret = new Uint8Array(await recipient.export(utf8.encode("message/bhttp response"), RESPONSE_NONCE_LEN));
  const responseNonce = crypto.getRandomValues(new Uint8Array(RESPONSE_NONCE_LEN));
  const { aead, nonce } = await responseKeys(secret, enc, responseNonce);
  const ct = new Uint8Array(await aead.seal(nonce, bytes(response), new Uint8Array(0)));
  return { request: hex(request), enc_response: hex(cat(responseNonce, ct)) };
}

const ops = { encapsulate, open, decapsulate };
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const results = [];
for (const job of JSON.parse(Buffer.concat(chunks).toString("utf8"))) {
  try {
    results.push(await ops[job.op](job));
  } catch (e) {
    results.push({ error: `${e.name}: ${e.message}` });
  }
}
process.stdout.write(JSON.stringify(results));
