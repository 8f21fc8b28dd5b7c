// Report tokens (docs/TOKENS.md): payload and token-input bytes, key checks, blinding and finalization.
// Self-contained tests sign with a key made here (raw RSA, the signer's step of RFC 9474 §4.3) and verify with
// node:crypto; the fixture tests compare with Python's hybriddp.core.tokens (tests/tokenhelpers.py): the same
// bytes from the same messages, the same verdict on keys, and from the same random bytes the same blinded
// message and token, RFC 9578's token type 2 vectors included.
import assert from "node:assert/strict";
import {
  constants, createHash, createPublicKey, generateKeyPairSync, privateDecrypt, verify as nodeVerify,
} from "node:crypto";
import { test } from "node:test";

import {
  blenderPayload, blindTokenInput, DeviceError, meanPayload, messagePayload, newMessageId, obtainToken,
  parseTokenKey, requestToken, tokenChallenge, tokenInput,
} from "../hybriddp-device.js";
import { loadFixtures, needsFixtures, seededBytes } from "./support.js";

const fx = loadFixtures()?.tokens ?? null;

const hex = (bytes) => Buffer.from(bytes).toString("hex");
const fromHex = (text) => Uint8Array.from(Buffer.from(text, "hex"));
const b64 = (bytes) => Buffer.from(bytes).toString("base64url");
const unb64 = (text) => Uint8Array.from(Buffer.from(text, "base64url"));
const sha256 = (bytes) => createHash("sha256").update(bytes).digest();

/** A 2048-bit round key made here: the key document the server would publish, and a raw blind signer (OpenSSL's
 * RSA private operation without padding, independent of the module's BigInt arithmetic). */
async function makeIssuer(round, bits = 2048) {
  const { publicKey, privateKey } = generateKeyPairSync("rsa", { modulusLength: bits, publicExponent: 65537 });
  const spki = new Uint8Array(publicKey.export({ type: "spki", format: "der" })); // rsaEncryption OID
  return {
    spki,
    doc: { token_type: 2, variant: "RSABSSA-SHA384-PSS-Deterministic", round, public_key: b64(spki),
      key_id: b64(sha256(spki)), admission: "tokens" },
    sign: (blinded) => b64(privateDecrypt({ key: privateKey, padding: constants.RSA_NO_PADDING },
      Buffer.from(unb64(blinded)))), // RFC 9474 §4.3, without its checks
  };
}

/** RSASSA-PSS verification by node:crypto (OpenSSL), independent of the module's WebCrypto call. */
function opensslVerifies(spki, input, token) {
  const key = createPublicKey({ key: Buffer.from(spki), format: "der", type: "spki" });
  return nodeVerify("sha384", input, { key, padding: constants.RSA_PKCS1_PSS_PADDING, saltLength: 48 },
    Buffer.from(unb64(token)));
}

const flipLast = (b64text) => {
  const raw = unb64(b64text);
  raw[raw.length - 1] ^= 1;
  return b64(raw);
};

// ----- byte formats -----------------------------------------------------------------------------

test("payloads: 4-byte big-endian counts and lengths, UTF-8, 0xFFFFFFFF for null; 'v' and a big-endian double",
  () => {
    assert.equal(hex(blenderPayload([])), "00000000");
    assert.equal(hex(blenderPayload([{ query: "a", url: null }, { query: null, url: "é" }])),
      "00000002" + "0000000161" + "ffffffff" + "ffffffff" + "00000002c3a9");
    assert.equal(hex(blenderPayload([{ query: "😀", url: "" }])), "00000001" + "00000004f09f9880" + "00000000");
    assert.equal(hex(meanPayload(1)), "763ff0000000000000");
    assert.equal(hex(meanPayload(-0)), "768000000000000000");
    assert.equal(hex(meanPayload(0)), "760000000000000000");
    assert.equal(hex(messagePayload({ id: "x", value: -2.5 })), "76c004000000000000");
    assert.equal(hex(messagePayload({ id: "x", value: -0 })), "760000000000000000"); // posted as 0
    assert.equal(hex(messagePayload({ id: "x", reports: [] })), "00000000");
    for (const bad of [[{ query: "\ud800", url: null }], [{ query: 1, url: null }], [{ query: "q" }], [null], "q"]) {
      assert.throws(() => blenderPayload(bad), DeviceError, JSON.stringify(bad));
    }
    for (const bad of [NaN, Infinity, "1.5", null, 1n]) assert.throws(() => meanPayload(bad), DeviceError);
  });

test("TokenChallenge and token_input: RFC 9578 layout", async () => {
  const ch = await tokenChallenge("round-1");
  assert.equal(ch.length, 47);
  assert.equal(hex(ch.subarray(0, 13)), `0002` + `0008` + hex(Buffer.from("hybriddp")) + "20");
  assert.equal(hex(ch.subarray(13, 45)), hex(sha256(Buffer.from("round-1"))));
  assert.equal(hex(ch.subarray(45)), "0000");
  const keyId = new Uint8Array(32).fill(7);
  const payload = blenderPayload([{ query: "q", url: null }]);
  const input = await tokenInput("round-1", keyId, "AAAAAAAAAAAAAAAAAAAAAA", payload);
  assert.equal(input.length, 98);
  const nonce = sha256(Buffer.concat([Buffer.from("hybriddp report token v1\0AAAAAAAAAAAAAAAAAAAAAA\0"), payload]));
  assert.equal(hex(input), "0002" + hex(nonce) + hex(sha256(ch)) + hex(keyId));
  await assert.rejects(tokenInput("round-ü", keyId, "AAAAAAAAAAAAAAAAAAAAAA", payload), DeviceError);
  await assert.rejects(tokenInput("r", keyId.subarray(1), "AAAAAAAAAAAAAAAAAAAAAA", payload), DeviceError);
  await assert.rejects(tokenInput("r", keyId, "AAAAAAAAAAAAAAAAAAAAAA", [0, 0, 0, 0]), DeviceError);
});

// ----- keys and tokens with a key made here ---------------------------------------------------------

test("a token from a blind signature verifies, binds the message, and a tampered answer is refused", async () => {
  const issuer = await makeIssuer("round-a");
  const key = await parseTokenKey(issuer.doc, "round-a");
  assert.equal(key.n.toString(2).length, 2048);
  assert.equal(key.e, 65537n);
  assert.equal(hex(key.keyId), hex(sha256(issuer.spki)));
  const id = newMessageId();
  const payload = blenderPayload([{ query: "weather", url: "https://example.com/" }]);
  const req = await requestToken(key, "round-a", id, payload);
  assert.match(req.blinded, /^[A-Za-z0-9_-]{342}$/); // 256 bytes, no padding
  assert.deepEqual(req.tokenInput, await tokenInput("round-a", key.keyId, id, payload));
  const blindSig = issuer.sign(req.blinded);
  await assert.rejects(req.finalize(flipLast(blindSig)), /not a valid blind signature.*does not verify/);
  await assert.rejects(req.finalize(blindSig.slice(4)), /must hold 256 bytes, found 253/);
  const token = await req.finalize(blindSig);
  assert.match(token, /^[A-Za-z0-9_-]{342}$/);
  assert.ok(opensslVerifies(issuer.spki, req.tokenInput, token));
  const other = await tokenInput("round-a", key.keyId, id, blenderPayload([{ query: "weather", url: null }]));
  assert.ok(!opensslVerifies(issuer.spki, other, token), "a token verifies for its own message only");
  await assert.rejects(requestToken(key, "round-b", id, payload), /round 'round-a''s, not 'round-b''s/);
  await assert.rejects(requestToken({ n: 5n }, "round-a", id, payload), /parseTokenKey/);
});

test("blinding is random: the same token input blinds differently each time; injected bytes replay it",
  async () => {
    const issuer = await makeIssuer("round-r");
    const key = await parseTokenKey(issuer.doc, "round-r");
    const payload = meanPayload(0.25);
    const id = newMessageId();
    const a = await requestToken(key, "round-r", id, payload);
    const b = await requestToken(key, "round-r", id, payload);
    assert.deepEqual(a.tokenInput, b.tokenInput);
    assert.notEqual(a.blinded, b.blinded);
    const [ta, tb] = [await a.finalize(issuer.sign(a.blinded)), await b.finalize(issuer.sign(b.blinded))];
    assert.notEqual(ta, tb); // PSS with a random salt
    assert.ok(opensslVerifies(issuer.spki, a.tokenInput, ta) && opensslVerifies(issuer.spki, b.tokenInput, tb));
    const seeded = async (seed) => (await requestToken(key, "round-r", id, payload,
      { getRandomValues: seededBytes(seed) })).blinded;
    assert.equal(await seeded("s1"), await seeded("s1"));
    assert.notEqual(await seeded("s1"), await seeded("s2"));
    await assert.rejects(requestToken(key, "round-r", id, payload, { getRandomValues: 3 }), /getRandomValues/);
  });

test("parseTokenKey refuses another round, another token type, a wrong key id and a short key", async () => {
  const issuer = await makeIssuer("round-k");
  const doc = issuer.doc;
  const cases = [
    [{ ...doc, round: "round-x" }, /round 'round-x'; expected 2 and round-k/],
    [{ ...doc, token_type: 1 }, /token type 1/],
    [{ ...doc, key_id: b64(new Uint8Array(32)) }, /not SHA-256 of 'public_key'/],
    [{ ...doc, key_id: "AAAA" }, /must hold 32 bytes, found 3/],
    [{ ...doc, public_key: "a+b/" }, /URL-safe base64/],
    [{ ...doc, public_key: b64(Buffer.from("not DER")), key_id: b64(sha256(Buffer.from("not DER"))) }, /malformed/],
    [[doc], /expected a JSON object/],
    [null, /expected a JSON object/],
  ];
  for (const [bad, message] of cases) await assert.rejects(parseTokenKey(bad, "round-k"), message);
  const small = await makeIssuer("round-k", 1024);
  await assert.rejects(parseTokenKey(small.doc, "round-k"), /not a 2048-bit key/);
  const key = await parseTokenKey(doc, "round-k");
  assert.ok(Object.isFrozen(key));
});

// ----- obtainToken against a stand-in server ----------------------------------------------------------

function fakeServer(issuer, round, { refuse = null, tamper = false, sigs = null } = {}) {
  const calls = [];
  const json = (status, body) => new Response(JSON.stringify(body), { status,
    headers: { "content-type": "application/json" } });
  const fetchFn = async (url, init = {}) => {
    calls.push({ url, init });
    if (url === `https://dp.example/api/v1/rounds/${round}/token-key` && (init.method ?? "GET") === "GET") {
      return json(200, issuer.doc);
    }
    if (url === `https://dp.example/api/v1/rounds/${round}/tokens` && init.method === "POST") {
      if (refuse) return json(refuse.status, { error: { code: refuse.code, message: refuse.message } });
      const { blinded_msgs: blinded } = JSON.parse(init.body);
      const answer = blinded.map((m) => (tamper ? flipLast(issuer.sign(m)) : issuer.sign(m)));
      return json(200, { blind_sigs: sigs ?? answer, key_id: issuer.doc.key_id, remaining: 0 });
    }
    return json(404, { error: { code: "not_found", message: `no route ${url}` } });
  };
  return { calls, fetchFn };
}

test("obtainToken: fetches the key, posts one blinded message with the credential, returns the message with its "
  + "token", async () => {
  const issuer = await makeIssuer("r1");
  const server = fakeServer(issuer, "r1");
  const message = { id: newMessageId(), headlist: "sha256:00", reports: [{ query: "ρ", url: null }] };
  const out = await obtainToken(server.fetchFn, "https://dp.example/", "r1", "cred-secret", message);
  assert.equal(message.token, undefined, "the message given is not changed");
  assert.deepEqual({ ...out, token: undefined }, { ...message, token: undefined });
  const key = await parseTokenKey(issuer.doc, "r1");
  const input = await tokenInput("r1", key.keyId, message.id, messagePayload(message));
  assert.ok(opensslVerifies(issuer.spki, input, out.token));
  assert.equal(server.calls.length, 2);
  const post = server.calls[1].init;
  assert.equal(post.headers.Authorization, "Bearer cred-secret");
  assert.equal(post.headers["Content-Type"], "application/json");
  const body = JSON.parse(post.body);
  assert.deepEqual(Object.keys(body), ["blinded_msgs"]);
  assert.equal(body.blinded_msgs.length, 1);

  const mean = { id: newMessageId(), round: "r1", value: -0 };
  const meanOut = await obtainToken(server.fetchFn, "https://dp.example", "r1", "cred-secret", mean);
  const meanInput = await tokenInput("r1", key.keyId, mean.id, meanPayload(0)); // -0 is posted as 0
  assert.ok(opensslVerifies(issuer.spki, meanInput, meanOut.token));
});

test("obtainToken: the server's refusal, a bad answer and a bad message are DeviceErrors", async () => {
  const issuer = await makeIssuer("r2");
  const message = { id: newMessageId(), reports: [] };
  const refuse = { status: 403, code: "issuance_limit", message: "this credential's tokens for round r2 are used up" };
  const refused = fakeServer(issuer, "r2", { refuse });
  await assert.rejects(obtainToken(refused.fetchFn, "https://dp.example", "r2", "c", message), (exc) => {
    assert.ok(exc instanceof DeviceError);
    assert.match(exc.message, /HTTP 403 issuance_limit\): this credential's tokens for round r2 are used up/);
    assert.equal(exc.status, 403);
    assert.equal(exc.code, "issuance_limit");
    return true;
  });
  await assert.rejects(obtainToken(fakeServer(issuer, "r2").fetchFn, "https://dp.example", "nope", "c", message),
    /HTTP 404 not_found\): no route/);
  await assert.rejects(obtainToken(fakeServer(issuer, "r2", { tamper: true }).fetchFn, "https://dp.example", "r2",
    "c", message), /does not verify/);
  await assert.rejects(obtainToken(fakeServer(issuer, "r2", { sigs: [] }).fetchFn, "https://dp.example", "r2", "c",
    message), /expected \{"blind_sigs": \[one signature\]\}/);
  const down = async () => {
    throw new TypeError("fetch failed");
  };
  await assert.rejects(obtainToken(down, "https://dp.example", "r2", "c", message), /cannot be reached \(fetch failed/);
  const html = async () => new Response("<html>oops</html>", { status: 502 });
  await assert.rejects(obtainToken(html, "", "r2", "c", message), /HTTP 502\): <html>oops/);
  const server = fakeServer(issuer, "r2");
  await assert.rejects(obtainToken(server.fetchFn, "https://dp.example", "r2", "c", { reports: [] }), /message id/);
  await assert.rejects(obtainToken(server.fetchFn, "https://dp.example", "r2", "c", { ...message, round: "r3" }),
    /for round 'r3', not 'r2'/);
  await assert.rejects(obtainToken(server.fetchFn, "https://dp.example", "r2", "c",
    { ...message, reports: [{ query: 5, url: null }] }), /reports\[0\]\.query = 5/);
  assert.equal(server.calls.length, 0, "a bad message is refused before anything is sent");
  for (const missing of [undefined, null, "", "  "]) {
    await assert.rejects(obtainToken(server.fetchFn, "https://dp.example", "r2", missing, message),
      /tokens need a device credential/);
  }
  assert.ok(server.calls.every((c) => !c.init.method), "without a credential only the key is fetched");
});

test("obtainToken: a message with a token keeps it; an open-admission server needs none", async () => {
  const issuer = await makeIssuer("r3");
  const server = fakeServer(issuer, "r3");
  const message = { id: newMessageId(), reports: [{ query: "q", url: null }] };
  const withToken = { ...message, token: "kept" };
  assert.deepEqual(await obtainToken(server.fetchFn, "https://dp.example", "r3", "c", withToken), withToken);
  assert.equal(server.calls.length, 0, "a resent message is not issued another token");
  const open = fakeServer({ ...issuer, doc: { ...issuer.doc, admission: "open" } }, "r3");
  const out = await obtainToken(open.fetchFn, "https://dp.example", "r3", null, message);
  assert.deepEqual(out, message);
  assert.notEqual(out, message);
  assert.deepEqual(open.calls.map((c) => c.init.method ?? "GET"), ["GET"]);
});

// ----- the same bytes as Python (fixtures of tests/tokenhelpers.py) -------------------------------------

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

test("payloads, challenges and token inputs are Python's bytes", needsFixtures(fx), async () => {
  const key = await parseTokenKey(fx.key_doc, fx.round);
  let compared = 0;
  for (const c of fx.payloads) {
    const what = JSON.stringify(c.message).slice(0, 120);
    if (c.error) {
      await assert.rejects((async () => tokenInput(fx.round, key.keyId, c.message.id,
        messagePayload(c.message)))(), DeviceError, what);
      continue;
    }
    const exact = Object.hasOwn(c.message, "value") ? meanPayload(c.message.value) : blenderPayload(c.message.reports);
    assert.equal(hex(exact), c.payload, what);
    const payload = messagePayload(c.message); // as the server reads the posted message (-0 is written as 0)
    assert.equal(hex(payload), c.posted_payload, what);
    assert.equal(hex(await tokenInput(fx.round, key.keyId, c.message.id, payload)), c.token_input, what);
    compared++;
  }
  assert.ok(compared >= 25 && fx.payloads.some((c) => c.error));
  const negZero = fx.payloads.find((c) => Object.is(c.message.value, -0));
  assert.ok(negZero && negZero.payload === "768000000000000000" && negZero.posted_payload === "760000000000000000");
  assert.equal(JSON.stringify(-0), "0", "why the posted message's -0 is 0");
  for (const c of fx.challenges) assert.equal(hex(await tokenChallenge(c.round)), c.challenge, c.round);
});

test("token keys: Python's verdict (RoundKey.from_dict)", needsFixtures(fx), async () => {
  for (const c of fx.keys) {
    if (c.error === null) {
      const key = await parseTokenKey(c.doc, fx.round);
      assert.equal(b64(key.keyId), c.doc.key_id.replace(/=+$/, ""), c.name);
    } else {
      await assert.rejects(parseTokenKey(c.doc, fx.round), DeviceError, `${c.name}: Python says ${c.error}`);
    }
  }
});

test("from the same random bytes: Python's blinded message, and its signature finalizes to Python's token",
  needsFixtures(fx), async () => {
    const key = await parseTokenKey(fx.key_doc, fx.round);
    for (const c of fx.blinds) {
      const req = await requestToken(key, fx.round, c.message.id, messagePayload(c.message),
        { getRandomValues: replayBytes(c.random) });
      assert.equal(req.blinded, c.blinded);
      assert.equal(await req.finalize(c.blind_sig), c.token);
      await assert.rejects(req.finalize(flipLast(c.blind_sig)), DeviceError);
    }
  });

test("RFC 9578 A.2 token type 2 vectors: blinded message and token", needsFixtures(fx), async () => {
  const key = await parseTokenKey(fx.rfc9578.key_doc, "rfc9578"); // the RFC's SPKI, RSASSA-PSS OID
  assert.equal(fx.rfc9578.vectors.length, 5);
  for (const v of fx.rfc9578.vectors) {
    const input = fromHex(v.token_input);
    assert.equal(hex(input.subarray(66)), hex(key.keyId));
    const req = await blindTokenInput(key, input, { getRandomValues: replayBytes(v.random) });
    assert.equal(hex(unb64(req.blinded)), v.blinded);
    assert.equal(hex(unb64(await req.finalize(b64(fromHex(v.blind_sig))))), v.token);
  }
});
