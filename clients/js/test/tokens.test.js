// Report tokens, protocol v2 (docs/TOKENS.md): random nonces, the Token structure, message ids derived from the
// nonce, keys checked against the head list's commitment, tokens fetched before the message, the report schedule.
// Self-contained tests sign with a key made here (raw RSA, the signer's step of RFC 9474 §4.3) and verify with
// node:crypto; the fixture tests compare with Python's hybriddp.core.tokens (tests/jstokenhelpers.py): the same
// bytes and ids from the same nonces, the same verdict on keys, and from the same random bytes the same blinded
// message and token, RFC 9578's token type 2 vectors included.
import assert from "node:assert/strict";
import {
  constants, createHash, createPublicKey, generateKeyPairSync, privateDecrypt, verify as nodeVerify,
} from "node:crypto";
import { test } from "node:test";

import {
  attachToken, blindTokenInput, checkCommittedKey, checkMirror, contentHash, DeviceError, encodeToken, fetchToken,
  messageIdFor, newNonce, outboxEntry, parseToken, parseTokenKey, reportTime, reportWindow, requestToken,
  sendReport, TOKEN_BYTES, tokenChallenge, tokenInput, validateHeadList,
} from "../hybriddp-device.js";
import { loadFixtures, needsFixtures, seededBytes } from "./support.js";

const fx = loadFixtures()?.tokens ?? null;

const hex = (bytes) => Buffer.from(bytes).toString("hex");
const fromHex = (text) => Uint8Array.from(Buffer.from(text, "hex"));
const b64 = (bytes) => Buffer.from(bytes).toString("base64url");
const unb64 = (text) => Uint8Array.from(Buffer.from(text, "base64url"));
const sha256 = (bytes) => createHash("sha256").update(bytes).digest();

/** A round key made here: the key document the server would publish, the head list's commitment to it, and a raw
 * blind signer (OpenSSL's RSA private operation without padding, independent of the module's BigInt arithmetic). */
function makeIssuer(round, bits = 2048, publicExponent = 65537) {
  const { publicKey, privateKey } = generateKeyPairSync("rsa", { modulusLength: bits, publicExponent });
  const spki = new Uint8Array(publicKey.export({ type: "spki", format: "der" })); // rsaEncryption OID
  return {
    spki,
    doc: { token_type: 2, variant: "RSABSSA-SHA384-PSS-Deterministic", round, public_key: b64(spki),
      key_id: b64(sha256(spki)), admission: "tokens" },
    headlist: { token_key: { key_id: b64(sha256(spki)), modulus_bits: bits, e: publicExponent } },
    sign: (blinded) => b64(privateDecrypt({ key: privateKey, padding: constants.RSA_NO_PADDING },
      Buffer.from(unb64(blinded)))), // RFC 9474 §4.3, without its checks
  };
}
const ISSUERS = new Map();
const issuerFor = (round) => { // one 2048-bit key per round name: key generation is the slow part
  if (!ISSUERS.has(round)) ISSUERS.set(round, makeIssuer(round));
  return ISSUERS.get(round);
};

/** RSASSA-PSS verification by node:crypto (OpenSSL), independent of the module's WebCrypto call. */
function opensslVerifies(spki, input, signature) {
  const key = createPublicKey({ key: Buffer.from(spki), format: "der", type: "spki" });
  return nodeVerify("sha384", input, { key, padding: constants.RSA_PKCS1_PSS_PADDING, saltLength: 48 },
    Buffer.from(signature));
}

const flipLast = (b64text) => {
  const raw = unb64(b64text);
  raw[raw.length - 1] ^= 1;
  return b64(raw);
};

const idFor = (nonce) => b64(sha256(Buffer.concat([Buffer.from("hybriddp message id v2\0"), nonce])).subarray(0, 16));

// ----- byte formats -----------------------------------------------------------------------------

test("TokenChallenge, token_input with a random nonce, and the message id derived from the nonce", async () => {
  const ch = await tokenChallenge("round-1");
  assert.equal(ch.length, 47);
  assert.equal(hex(ch.subarray(0, 13)), `0002` + `0008` + hex(Buffer.from("hybriddp")) + "20");
  assert.equal(hex(ch.subarray(13, 45)), hex(sha256(Buffer.from("round-1"))));
  assert.equal(hex(ch.subarray(45)), "0000");
  const keyId = new Uint8Array(32).fill(7);
  const nonce = newNonce();
  assert.equal(nonce.length, 32);
  assert.notEqual(hex(nonce), hex(newNonce()), "fresh random bytes each time");
  const input = await tokenInput("round-1", keyId, nonce);
  assert.equal(input.length, 98);
  assert.equal(hex(input), "0002" + hex(nonce) + hex(sha256(ch)) + hex(keyId));
  assert.equal(messageIdFor(nonce), idFor(nonce));
  assert.match(messageIdFor(nonce), /^[A-Za-z0-9_-]{22}$/);
  assert.equal(messageIdFor(new Uint8Array(32)), idFor(Buffer.alloc(32)));
  assert.equal(hex(newNonce({ getRandomValues: seededBytes("n") })), hex(newNonce({ getRandomValues: seededBytes("n") })));
  await assert.rejects(tokenInput("round-ü", keyId, nonce), DeviceError);
  await assert.rejects(tokenInput("r", keyId.subarray(1), nonce), DeviceError);
  await assert.rejects(tokenInput("r", keyId, nonce.subarray(1)), /32 bytes/);
  assert.throws(() => messageIdFor([1, 2]), DeviceError);
});

test("the Token structure: 354 bytes, parsed back with its id; other types and sizes refused", async () => {
  const nonce = newNonce();
  const input = await tokenInput("r", new Uint8Array(32).fill(1), nonce);
  const auth = new Uint8Array(256).fill(9);
  const text = encodeToken(input, auth);
  assert.equal(unb64(text).length, TOKEN_BYTES);
  assert.equal(TOKEN_BYTES, 354);
  const tok = parseToken(text);
  assert.equal(hex(tok.nonce), hex(nonce));
  assert.equal(hex(tok.input), hex(input));
  assert.equal(hex(tok.authenticator), hex(auth));
  assert.equal(hex(tok.keyId), hex(new Uint8Array(32).fill(1)));
  assert.equal(tok.messageId, messageIdFor(nonce));
  const other = unb64(text);
  other[1] = 1;
  assert.throws(() => parseToken(b64(other)), /token type 0001 is not 0002/);
  assert.throws(() => parseToken(text.slice(4)), /354 bytes/);
  assert.throws(() => encodeToken(input, auth.subarray(1)), /256 bytes/);
  const msg = { id: "x", headlist: "sha256:00", reports: [] };
  const spent = attachToken(msg, text);
  assert.deepEqual(spent, { id: tok.messageId, headlist: "sha256:00", reports: [], token: text });
  assert.equal(msg.id, "x", "the message given is not changed");
  assert.deepEqual(attachToken(msg, { token: text, messageId: tok.messageId }), spent);
  assert.throws(() => attachToken(msg, { token: text, messageId: "AAAAAAAAAAAAAAAAAAAAAA" }), /messageId/);
  assert.deepEqual(attachToken(msg, { token: null, messageId: "AAAAAAAAAAAAAAAAAAAAAA" }),
    { ...msg, id: "AAAAAAAAAAAAAAAAAAAAAA" });
});

// ----- keys and tokens with a key made here ---------------------------------------------------------

test("a token from a blind signature is the Token struct, verifies, and a tampered answer is refused", async () => {
  const issuer = issuerFor("round-a");
  const key = await parseTokenKey(issuer.doc, "round-a", issuer.headlist);
  assert.equal(key.n.toString(2).length, 2048);
  assert.equal(key.e, 65537n);
  assert.equal(hex(key.keyId), hex(sha256(issuer.spki)));
  const req = await requestToken(key, "round-a");
  assert.equal(req.nonce.length, 32);
  assert.equal(req.messageId, idFor(req.nonce));
  assert.match(req.blinded, /^[A-Za-z0-9_-]{342}$/); // 256 bytes, no padding
  assert.deepEqual(req.tokenInput, await tokenInput("round-a", key.keyId, req.nonce));
  const blindSig = issuer.sign(req.blinded);
  await assert.rejects(req.finalize(flipLast(blindSig)), /not a valid blind signature.*does not verify/);
  await assert.rejects(req.finalize(blindSig.slice(4)), /must hold 256 bytes, found 253/);
  const token = await req.finalize(blindSig);
  assert.match(token, /^[A-Za-z0-9_-]{472}$/); // 354 bytes
  const parsed = parseToken(token);
  assert.equal(hex(parsed.input), hex(req.tokenInput));
  assert.equal(parsed.messageId, req.messageId);
  assert.ok(opensslVerifies(issuer.spki, parsed.input, parsed.authenticator));
  const given = newNonce();
  const again = await requestToken(key, "round-a", { nonce: given });
  assert.equal(again.messageId, messageIdFor(given));
  await assert.rejects(requestToken(key, "round-b"), /round 'round-a''s, not 'round-b''s/);
  await assert.rejects(requestToken({ n: 5n }, "round-a"), /parseTokenKey/);
  await assert.rejects(requestToken(key, "round-a", { nonce: new Uint8Array(31) }), /32 bytes/);
});

test("blinding is random: the same nonce blinds differently each time; injected bytes replay it", async () => {
  const issuer = issuerFor("round-r");
  const key = await parseTokenKey(issuer.doc, "round-r", issuer.headlist);
  const nonce = newNonce();
  const a = await requestToken(key, "round-r", { nonce });
  const b = await requestToken(key, "round-r", { nonce });
  assert.deepEqual(a.tokenInput, b.tokenInput);
  assert.notEqual(a.blinded, b.blinded);
  const [ta, tb] = [await a.finalize(issuer.sign(a.blinded)), await b.finalize(issuer.sign(b.blinded))];
  assert.notEqual(ta, tb); // PSS with a random salt
  const seeded = async (seed) => requestToken(key, "round-r", { getRandomValues: seededBytes(seed) });
  const [s1, s1b, s2] = [await seeded("s1"), await seeded("s1"), await seeded("s2")];
  assert.equal(s1.blinded, s1b.blinded);
  assert.equal(s1.messageId, s1b.messageId);
  assert.notEqual(s1.blinded, s2.blinded);
  assert.notEqual(s1.messageId, s2.messageId);
  await assert.rejects(requestToken(key, "round-r", { getRandomValues: 3 }), /getRandomValues/);
});

test("parseTokenKey refuses a key the head list does not commit to, e ≠ 65537, a small modulus", async () => {
  const issuer = issuerFor("round-k");
  const { doc, headlist } = issuer;
  const tk = headlist.token_key;
  const cases = [
    [doc, {}, /commits to no token key.*published before round keys were committed/],
    [doc, undefined, /commits to no token key/],
    [doc, { token_key: { ...tk, key_id: b64(new Uint8Array(32)) } }, /is not the key the head list commits to/],
    [doc, { token_key: { ...tk, key_id: "AAAA" } }, /must hold 32 bytes/],
    [doc, { token_key: { ...tk, e: 3 } }, /exponent 3 \(key: 65537\); only 65537/],
    [doc, { token_key: { ...tk, modulus_bits: 3072 } }, /modulus of 2048 bits, the head list says 3072/],
    [doc, { token_key: { ...tk, modulus_bits: 1024 } }, /the head list says 1024/],
    [doc, { token_key: { ...tk, modulus_bits: "2048" } }, /the head list says '2048'/],
    [{ ...doc, round: "round-x" }, headlist, /round 'round-x'; expected 2 and round-k/],
    [{ ...doc, token_type: 1 }, headlist, /token type 1/],
    [{ ...doc, key_id: b64(new Uint8Array(32)) }, headlist, /not SHA-256 of 'public_key'/],
    [{ ...doc, public_key: "a+b/" }, headlist, /URL-safe base64/],
    [{ ...doc, public_key: b64(Buffer.from("not DER")), key_id: b64(sha256(Buffer.from("not DER"))) }, headlist,
      /malformed/],
    [[doc], headlist, /expected a JSON object/],
  ];
  for (const [bad, hl, message] of cases) await assert.rejects(parseTokenKey(bad, "round-k", hl), message);
  const small = makeIssuer("round-k", 1024);
  await assert.rejects(parseTokenKey(small.doc, "round-k", small.headlist), /not a 2048-bit key/);
  const e3 = makeIssuer("round-k", 2048, 3);
  await assert.rejects(parseTokenKey(e3.doc, "round-k", e3.headlist), /public exponent 3 is not 65537/);
  const key = await parseTokenKey(doc, "round-k", headlist);
  assert.ok(Object.isFrozen(key));
  assert.throws(() => checkCommittedKey(key, { ...tk, e: 65537n }), /exponent/); // a JS object's numbers only
});

// ----- fetchToken, sendReport, checkMirror against a stand-in server --------------------------------

function fakeServer(issuer, round, { refuse = null, tamper = false, sigs = null, keyDoc = null } = {}) {
  const calls = [];
  const json = (status, body, headers = {}) => new Response(JSON.stringify(body), { status,
    headers: { "content-type": "application/json", ...headers } });
  const fetchFn = async (url, init = {}) => {
    calls.push({ url, init });
    if (url === `https://dp.example/api/v1/rounds/${round}/token-key` && (init.method ?? "GET") === "GET") {
      return json(200, keyDoc ?? issuer.doc);
    }
    if (url === `https://dp.example/api/v1/rounds/${round}/tokens` && init.method === "POST") {
      if (refuse) return json(refuse.status, { error: { code: refuse.code, message: refuse.message } });
      const { blinded_msgs: blinded } = JSON.parse(init.body);
      const answer = blinded.map((m) => (tamper ? flipLast(issuer.sign(m)) : issuer.sign(m)));
      return json(200, { blind_sigs: sigs ?? answer, key_id: issuer.doc.key_id, remaining: 0 });
    }
    if (url === `https://dp.example/api/v1/rounds/${round}/reports` && init.method === "POST") {
      return json(409, { error: { code: "too_few_tokens", message: "wait" } }, { "Retry-After": "30" });
    }
    return json(404, { error: { code: "not_found", message: `no route ${url}` } });
  };
  return { calls, fetchFn };
}

test("fetchToken: the key checked against the head list, one blinded nonce posted with the credential; the token "
  + "and the id of the message that will spend it", async () => {
  const issuer = issuerFor("r1");
  const server = fakeServer(issuer, "r1");
  const got = await fetchToken(server.fetchFn, "https://dp.example/", "r1", "cred-secret", issuer.headlist);
  assert.deepEqual(Object.keys(got).sort(), ["keyId", "messageId", "token"]);
  const tok = parseToken(got.token);
  assert.equal(got.messageId, tok.messageId);
  assert.ok(opensslVerifies(issuer.spki, tok.input, tok.authenticator));
  assert.equal(server.calls.length, 2);
  const post = server.calls[1].init;
  assert.equal(post.headers.Authorization, "Bearer cred-secret");
  assert.equal(post.credentials, "omit");
  const body = JSON.parse(post.body);
  assert.deepEqual(Object.keys(body), ["blinded_msgs"]);
  assert.equal(body.blinded_msgs.length, 1);
  const message = attachToken({ id: "ignored", headlist: "sha256:00", reports: [{ query: "ρ", url: null }] }, got);
  assert.equal(message.id, got.messageId);
  const second = await fetchToken(server.fetchFn, "https://dp.example", "r1", "cred-secret", issuer.headlist);
  assert.notEqual(second.messageId, got.messageId, "each token its own random nonce");
});

test("fetchToken: a key other than the committed one is refused before anything is posted", async () => {
  const issuer = issuerFor("r5");
  const other = issuerFor("r5-other");
  const wrong = fakeServer(issuer, "r5", { keyDoc: { ...other.doc, round: "r5" } });
  await assert.rejects(fetchToken(wrong.fetchFn, "https://dp.example", "r5", "c", issuer.headlist),
    /is not the key the head list commits to/);
  assert.deepEqual(wrong.calls.map((c) => c.init.method ?? "GET"), ["GET"]);
  const none = fakeServer(issuer, "r5");
  await assert.rejects(fetchToken(none.fetchFn, "https://dp.example", "r5", "c", { format: "hybriddp-headlist" }),
    /published before round keys were committed/);
  assert.deepEqual(none.calls.map((c) => c.init.method ?? "GET"), ["GET"]);
  await assert.rejects(fetchToken(none.fetchFn, "https://dp.example", "r5", "c", null), /head-list document/);
});

test("fetchToken: the server's refusal and a bad answer are DeviceErrors; open admission needs no token", async () => {
  const issuer = issuerFor("r2");
  const hl = issuer.headlist;
  const refuse = { status: 403, code: "issuance_limit", message: "this credential's tokens for round r2 are used up" };
  await assert.rejects(fetchToken(fakeServer(issuer, "r2", { refuse }).fetchFn, "https://dp.example", "r2", "c", hl),
    (exc) => {
      assert.ok(exc instanceof DeviceError);
      assert.match(exc.message, /HTTP 403 issuance_limit\): this credential's tokens for round r2 are used up/);
      assert.equal(exc.status, 403);
      assert.equal(exc.code, "issuance_limit");
      return true;
    });
  await assert.rejects(fetchToken(fakeServer(issuer, "r2").fetchFn, "https://dp.example", "nope", "c", hl),
    /HTTP 404 not_found\): no route/);
  await assert.rejects(fetchToken(fakeServer(issuer, "r2", { tamper: true }).fetchFn, "https://dp.example", "r2", "c",
    hl), /does not verify/);
  await assert.rejects(fetchToken(fakeServer(issuer, "r2", { sigs: [] }).fetchFn, "https://dp.example", "r2", "c", hl),
    /expected \{"blind_sigs": \[one signature\]\}/);
  const down = async () => {
    throw new TypeError("fetch failed");
  };
  await assert.rejects(fetchToken(down, "https://dp.example", "r2", "c", hl), /cannot be reached \(fetch failed/);
  const server = fakeServer(issuer, "r2");
  for (const missing of [undefined, null, "", "  "]) {
    await assert.rejects(fetchToken(server.fetchFn, "https://dp.example", "r2", missing, hl),
      /tokens need a device credential/);
  }
  assert.ok(server.calls.every((c) => !c.init.method), "without a credential only the key is fetched");
  const open = fakeServer(issuer, "r2", { keyDoc: { ...issuer.doc, admission: "open" } });
  const got = await fetchToken(open.fetchFn, "https://dp.example", "r2", null, {});
  assert.equal(got.token, null);
  assert.equal(got.admission, "open");
  assert.match(got.messageId, /^[A-Za-z0-9_-]{22}$/);
  assert.deepEqual(open.calls.map((c) => c.init.method ?? "GET"), ["GET"]);
});

test("sendReport posts the message; 409 too_few_tokens carries Retry-After", async () => {
  const issuer = issuerFor("r3");
  const server = fakeServer(issuer, "r3");
  const msg = { id: "AAAAAAAAAAAAAAAAAAAAAA", headlist: "sha256:00", reports: [] };
  await assert.rejects(sendReport(server.fetchFn, "https://dp.example", "r3", msg), (exc) => {
    assert.equal(exc.status, 409);
    assert.equal(exc.code, "too_few_tokens");
    assert.equal(exc.retryAfter, 30);
    return true;
  });
  assert.deepEqual(JSON.parse(server.calls[0].init.body), msg);
  const ok = async () => new Response(JSON.stringify({ counted: 1 }), { status: 202 });
  assert.deepEqual(await sendReport(ok, "", "r3", msg), { counted: 1 });
});

async function hashed(doc) {
  return { ...doc, content_hash: await contentHash(doc) };
}

test("checkMirror: the mirror's copy must hash to the one the device got", async () => {
  const doc = await hashed({ format: "hybriddp-headlist", version: 1, epsilon: 1.0, delta: 1e-6, f_c: 0.5, m_c: 1,
    queries: [], token_key: issuerFor("r4").headlist.token_key });
  const served = (d) => async (url) => {
    assert.equal(url, "https://mirror.example/api/v1/rounds/r4/headlist");
    return new Response(JSON.stringify(d), { status: 200 });
  };
  assert.equal(await checkMirror(served(doc), "https://mirror.example/", "r4", doc.content_hash), doc.content_hash);
  const other = await hashed({ ...doc, token_key: { ...doc.token_key, key_id: b64(new Uint8Array(32)) } });
  await assert.rejects(checkMirror(served(other), "https://mirror.example", "r4", doc.content_hash),
    /different head lists/);
  await assert.rejects(checkMirror(served({ ...doc, epsilon: 2.0 }), "https://mirror.example", "r4", doc.content_hash),
    /different head lists/); // a copy whose declared hash is not its content
});

// ----- the schedule --------------------------------------------------------------------------------

test("reportTime: uniform in the window before it opens, in what is left inside it, now after it", () => {
  const doc = { report_window: { opens: "2026-11-28T19:00:00Z", closes: "2026-11-28T20:00:00Z" } };
  const opens = Date.UTC(2026, 10, 28, 19) / 1000;
  const closes = opens + 3600;
  assert.deepEqual(reportWindow(doc), [opens, closes]);
  assert.equal(reportTime(doc, opens - 100, () => 0), opens);
  assert.equal(reportTime(doc, opens - 100, () => 0.5), opens + 1800);
  assert.equal(reportTime(doc, opens + 600, () => 0.5), opens + 600 + 1500);
  assert.equal(reportTime(doc, closes + 5, () => 0.5), closes + 5);
  assert.equal(reportTime(doc, closes, () => 0.5), closes);
  assert.equal(reportTime({}, 1234.5), 1234.5);
  const instant = { report_window: { opens: doc.report_window.opens, closes: doc.report_window.opens } };
  assert.equal(reportTime(instant, opens - 100, () => 0.5), opens, "a window of no length: its one instant");
  assert.equal(reportTime(instant, opens + 1, () => 0.5), opens + 1);
  const draws = Array.from({ length: 2000 }, () => reportTime(doc, opens - 10));
  assert.ok(draws.every((t) => t >= opens && t < closes));
  const mean = draws.reduce((s, t) => s + t, 0) / draws.length;
  assert.ok(Math.abs(mean - (opens + 1800)) < 120, `${mean - opens}`); // ~5.5 standard errors
  assert.deepEqual(outboxEntry({ id: "m" }, doc, { reportNow: true, nowSeconds: opens - 100 }),
    { message: { id: "m" }, send_at: opens - 100 });
  assert.equal(outboxEntry({ id: "m" }, doc, { nowSeconds: opens - 100, random: () => 0.25 }).send_at, opens + 900);
  assert.equal(reportWindow({ report_window: { opens: "2026-11-28T19:00:00.5Z", closes: "2026-11-28T19:00:01Z" } })[0],
    opens + 0.5);
  for (const bad of [{ opens: "2026-11-28 19:00:00Z", closes: "2026-11-28T20:00:00Z" },
    { opens: "2026-11-28T19:00:00+00:00", closes: "2026-11-28T20:00:00Z" },
    { opens: "2026-02-30T19:00:00Z", closes: "2026-11-28T20:00:00Z" },
    { opens: "2026-11-28T21:00:00Z", closes: "2026-11-28T20:00:00Z" }, "x", [1]]) {
    assert.throws(() => reportWindow({ report_window: bad }), DeviceError, JSON.stringify(bad));
  }
});

test("head lists: the optional committed fields are accepted, and type-checked when present", async () => {
  const base = { format: "hybriddp-headlist", version: 1, epsilon: 1.5, delta: 1e-6, f_c: 0.5, m_c: 1,
    queries: [{ query: "q", urls: ["u"] }] };
  const full = { ...base, token_key: { key_id: b64(sha256(Buffer.from("k"))), modulus_bits: 2048, e: 65537 },
    ohttp_key: b64(Buffer.from("config")), report_window: { opens: "2026-11-28T19:00:00Z",
      closes: "2026-11-28T20:00:00Z" } };
  await validateHeadList(await hashed(base));
  await validateHeadList(await hashed(full));
  await validateHeadList(JSON.stringify(await hashed(full)));
  const bad = [
    [{ token_key: "x" }, /'token_key' = 'x' is a string; it must be an object/],
    [{ token_key: { ...full.token_key, key_id: "AAAA" } }, /token_key.key_id' = 'AAAA' must be 32 bytes/],
    [{ token_key: { ...full.token_key, modulus_bits: 1024 } }, /modulus_bits' = 1024 is not allowed/],
    [{ token_key: { ...full.token_key, modulus_bits: 2048.5 } }, /modulus_bits' = 2048.5 is not an integer/],
    [{ token_key: { ...full.token_key, e: 3 } }, /token_key.e' = 3 is not allowed: it must be 65537/],
    [{ token_key: { key_id: full.token_key.key_id, e: 65537 } }, /modulus_bits' = None/],
    [{ ohttp_key: 5 }, /'ohttp_key' = 5 must be a KeyConfig/],
    [{ ohttp_key: "not base64!" }, /ohttp_key/],
    [{ report_window: [] }, /'report_window' = \[\] is a list/],
    [{ report_window: { ...full.report_window, opens: "yesterday" } }, /report_window.opens/],
    [{ report_window: { opens: full.report_window.closes, closes: full.report_window.opens } }, /is before opens/],
  ];
  for (const [change, message] of bad) {
    await assert.rejects(validateHeadList(await hashed({ ...full, ...change })), message, JSON.stringify(change));
  }
});

// ----- the same bytes as Python (fixtures of tests/jstokenhelpers.py) -------------------------------------

/** A getRandomValues that hands out the given bytes in order (as tokenhelpers.stream does in Python). */
function replayBytes(hexText) {
  const data = fromHex(hexText);
  let pos = 0;
  return (array) => {
    const view = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
    assert.ok(pos + view.length <= data.length, "the replayed random bytes are used up");
    view.set(data.subarray(pos, pos + view.length));
    pos += view.length;
    return array;
  };
}

test("token inputs, message ids and challenges are Python's", needsFixtures(fx), async () => {
  const key = await parseTokenKey(fx.key_doc, fx.round, fx.headlist);
  for (const c of fx.nonces) {
    const nonce = fromHex(c.nonce);
    assert.equal(hex(await tokenInput(fx.round, key.keyId, nonce)), c.token_input);
    assert.equal(messageIdFor(nonce), c.message_id);
  }
  assert.ok(fx.nonces.length >= 20);
  for (const c of fx.challenges) assert.equal(hex(await tokenChallenge(c.round)), c.challenge, c.round);
});

test("token keys: Python's verdict (RoundKey.from_dict with the head list's commitment)", needsFixtures(fx),
  async () => {
    for (const c of fx.keys) {
      if (c.error === null) {
        const key = await parseTokenKey(c.doc, fx.round, { token_key: c.committed });
        assert.equal(b64(key.keyId), c.doc.key_id.replace(/=+$/, ""), c.name);
      } else {
        await assert.rejects(parseTokenKey(c.doc, fx.round, { token_key: c.committed }), DeviceError,
          `${c.name}: Python says ${c.error}`);
      }
    }
  });

test("from the same nonce and random bytes: Python's blinded message, message id and Token", needsFixtures(fx),
  async () => {
    const key = await parseTokenKey(fx.key_doc, fx.round, fx.headlist);
    for (const c of fx.blinds) {
      const req = await requestToken(key, fx.round, { nonce: fromHex(c.nonce),
        getRandomValues: replayBytes(c.random) });
      assert.equal(req.blinded, c.blinded);
      assert.equal(req.messageId, c.message_id);
      assert.equal(await req.finalize(c.blind_sig), c.token);
      await assert.rejects(req.finalize(flipLast(c.blind_sig)), DeviceError);
      assert.deepEqual(attachToken(c.message, c.token), c.spent);
    }
  });

test("RFC 9578 A.2 token type 2 vectors: blinded message and token", needsFixtures(fx), async () => {
  const key = await parseTokenKey(fx.rfc9578.key_doc, "rfc9578", fx.rfc9578.headlist); // the RFC's SPKI
  assert.equal(fx.rfc9578.vectors.length, 5);
  for (const v of fx.rfc9578.vectors) {
    const input = fromHex(v.token_input);
    assert.equal(hex(input.subarray(66)), hex(key.keyId));
    const req = await blindTokenInput(key, input, { getRandomValues: replayBytes(v.random) });
    assert.equal(hex(unb64(req.blinded)), v.blinded);
    const authenticator = unb64(await req.finalize(b64(fromHex(v.blind_sig))));
    assert.equal(hex(authenticator), v.token);
    assert.equal(hex(unb64(encodeToken(input, authenticator))), v.token_input + v.token); // the RFC's Token bytes
  }
});
