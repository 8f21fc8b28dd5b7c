// Oblivious HTTP in the JS device (spec v2 §4): HPKE base-mode sender against RFC 9180 A.3.1, binary HTTP, and
// OHTTP encapsulation checked against hybriddp.core.ohttp: a small Python process (ohttp-python.py) decapsulates
// what JS sealed and seals a response JS opens, and ohttpFetch runs a whole request through it.
// Python is $HYBRIDDP_PYTHON (pytest sets it: tests/test_js_device.py), else `python3`; without hybriddp importable
// the Python tests are skipped, and pytest asserts nothing is skipped.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  checkOhttpKey, decodeBhttpResponse, DeviceError, encodeBhttpRequest, fetchOhttpKeys, hpkeSetupBaseS,
  ohttpEncapsulate, ohttpFetch, parseKeyConfig, parseOhttpKeys,
} from "../hybriddp-device.js";
import "./support.js";

const hex = (bytes) => Buffer.from(bytes).toString("hex");
const fromHex = (text) => Uint8Array.from(Buffer.from(text, "hex"));
const b64 = (bytes) => Buffer.from(bytes).toString("base64url");

// RFC 9180 Appendix A.3.1: DHKEM(P-256, HKDF-SHA256), HKDF-SHA256, AES-128-GCM, base mode
const A31 = {
  info: "4f6465206f6e2061204772656369616e2055726e",
  skEm: "4995788ef4b9d6132b249ce59a77281493eb39af373d236a1fe415cb0c2d7beb",
  pkEm: "04a92719c6195d5085104f469a8b9814d5838ff72b60501e2c4466e5e67b325ac98536d7b61a1af4b78e5b7f951c0900be863c403ce65c9bfcb9382657222d18c4",
  pkRm: "04fe8c19ce0905191ebc298a9245792531f26f0cece2460639e8bc39cb7f706a826a779b4cf969b8a0e539c7f62fb3d30ad6aa8f80e30f1d128aafd68a2ce72ea0",
  pt: "4265617574792069732074727574682c20747275746820626561757479",
  ct: [["436f756e742d30", "5ad590bb8baa577f8619db35a36311226a896e7342a6d836d8b7bcd2f20b6c7f9076ac232e3ab2523f39513434"],
    ["436f756e742d31", "fa6f037b47fc21826b610172ca9637e82d6e5801eb31cbd3748271affd4ecb06646e0329cbdf3c3cd655b28e82"]],
  export0: "5e9bc3d236e1911d95e65b576a8a86d478fb827e8bdfe77b741b289890490d4d", // context "", L = 32
};

async function ephemeral(skHex, pkHex) {
  const pk = fromHex(pkHex);
  const jwk = { kty: "EC", crv: "P-256", d: b64(fromHex(skHex)), x: b64(pk.slice(1, 33)), y: b64(pk.slice(33)) };
  const privateKey = await crypto.subtle.importKey("jwk", jwk, { name: "ECDH", namedCurve: "P-256" }, false,
    ["deriveBits"]);
  return { privateKey, publicKey: pk };
}

test("HPKE SetupBaseS, Seal and Export give RFC 9180 A.3.1's bytes", async () => {
  const ctx = await hpkeSetupBaseS(fromHex(A31.pkRm), fromHex(A31.info), { ephemeral: await ephemeral(A31.skEm,
    A31.pkEm) });
  assert.equal(hex(ctx.enc), A31.pkEm);
  for (const [aad, ct] of A31.ct) assert.equal(hex(await ctx.seal(fromHex(aad), fromHex(A31.pt))), ct);
  assert.equal(hex(await ctx.export(new Uint8Array(0), 32)), A31.export0);
  const fresh = await hpkeSetupBaseS(fromHex(A31.pkRm), fromHex(A31.info));
  assert.notEqual(hex(fresh.enc), A31.pkEm, "a fresh ephemeral key by default");
  const off = fromHex(A31.pkRm);
  off[64] ^= 1;
  await assert.rejects(hpkeSetupBaseS(off, new Uint8Array(0)), /not a point on P-256/);
  await assert.rejects(hpkeSetupBaseS(off.subarray(1), new Uint8Array(0)), /65-byte uncompressed/);
});

test("binary HTTP: a known-length request's bytes, a response decoded (informational skipped, padding)", () => {
  const req = encodeBhttpRequest({ method: "POST", scheme: "https", authority: "dp.example", path: "/a?b",
    headers: { "Content-Type": "application/json" }, body: "{}" });
  assert.equal(hex(req), "00" + "04" + hex(Buffer.from("POST")) + "05" + hex(Buffer.from("https"))
    + "0a" + hex(Buffer.from("dp.example")) + "04" + hex(Buffer.from("/a?b"))
    + "1e" + "0c" + hex(Buffer.from("content-type")) + "10" + hex(Buffer.from("application/json"))
    + "02" + "7b7d" + "00");
  const field = (k, v) => [k.length, ...Buffer.from(k), v.length, ...Buffer.from(v)];
  const f = field("a", "b");
  const resp = Uint8Array.from([1, 0x40, 103, f.length, ...f, 0x40, 200, f.length, ...f, 2, 0x68, 0x69, 0, 0, 0]);
  assert.deepEqual(decodeBhttpResponse(resp), { status: 200, headers: [["a", "b"]], body: Uint8Array.of(0x68, 0x69) });
  const truncated = Uint8Array.from([1, 0x41, 0x94, 0]); // 404, no fields, no content, no trailers
  assert.deepEqual(decodeBhttpResponse(truncated), { status: 404, headers: [], body: new Uint8Array(0) });
  assert.throws(() => decodeBhttpResponse(Uint8Array.of(0, 0x40, 200)), /framing indicator 1/);
  assert.throws(() => decodeBhttpResponse(Uint8Array.of(1, 0x40, 200, 5, 1)), /truncated/);
  assert.throws(() => decodeBhttpResponse(Uint8Array.from([1, 0x40, 200, 0, 0, 0, 7])), /padding/);
});

test("key configs: parsed, other suites refused or skipped", () => {
  const pk = fromHex(A31.pkRm);
  const config = Uint8Array.from([7, 0, 0x10, ...pk, 0, 8, 0, 1, 0, 2, 0, 1, 0, 1]);
  const parsed = parseKeyConfig(config);
  assert.equal(parsed.keyId, 7);
  assert.equal(hex(parsed.publicKey), A31.pkRm);
  assert.deepEqual(parseKeyConfig(b64(config)), parsed);
  const x25519 = Uint8Array.from([1, 0, 0x20, ...pk, 0, 4, 0, 1, 0, 1]);
  assert.throws(() => parseKeyConfig(x25519), /KEM 32/);
  assert.throws(() => parseKeyConfig(Uint8Array.from([7, 0, 0x10, ...pk, 0, 4, 0, 1, 0, 2])), /no HKDF-SHA256/);
  const keys = Uint8Array.from([0, x25519.length, ...x25519, 0, config.length, ...config]);
  assert.deepEqual(parseOhttpKeys(keys).map((c) => c.keyId), [7]);
  const relay = { keyConfig: b64(config) };
  checkOhttpKey({ ohttp_key: b64(config) }, relay);
  assert.throws(() => checkOhttpKey({ ohttp_key: b64(x25519) }, relay), /not the one the head list commits to/);
  assert.throws(() => checkOhttpKey({}, relay), /names no gateway key/);
});

// ----- against Python (hybriddp.core.ohttp as the gateway) ---------------------------------------------

const SCRIPT = fileURLToPath(new URL("./ohttp-python.py", import.meta.url));
const PYTHON = process.env.HYBRIDDP_PYTHON || "python3";

function python(job) {
  const run = spawnSync(PYTHON, [SCRIPT], { input: JSON.stringify(job), encoding: "utf8", timeout: 60_000 });
  if (run.status !== 0) throw new Error(`${PYTHON} ${SCRIPT} failed (${run.status}): ${run.stderr}`);
  return JSON.parse(run.stdout);
}

const probe = spawnSync(PYTHON, ["-c", "import hybriddp.core.ohttp, hybriddp.core.bhttp"], { encoding: "utf8" });
const needsPython = probe.status === 0 ? {} : {
  skip: `${PYTHON} cannot import hybriddp.core.ohttp: set HYBRIDDP_PYTHON (pytest tests/test_js_device.py does)`,
};

test("Python decapsulates what JS sealed, and JS opens the response Python sealed", needsPython, async () => {
  const { config, key } = python({ op: "key", key_id: 3 });
  assert.equal(parseKeyConfig(config).keyId, 3);
  const body = JSON.stringify({ blinded_msgs: ["ü"] });
  const request = encodeBhttpRequest({ method: "POST", scheme: "https", authority: "dp.example",
    path: "/api/v1/rounds/r1/tokens", headers: [["Authorization", "Bearer x"], ["Content-Type", "application/json"]],
    body });
  const { encRequest, open } = await ohttpEncapsulate(config, request);
  assert.equal(hex(encRequest.subarray(0, 7)), "03001000010001");
  const content = Buffer.from(JSON.stringify({ blind_sigs: ["s"], remaining: 0 }));
  const out = python({ op: "serve", key, enc_request: hex(encRequest), status: 200,
    headers: [["content-type", "application/json"]], content: hex(content) });
  assert.deepEqual(out.request, { method: "POST", scheme: "https", authority: "dp.example",
    path: "/api/v1/rounds/r1/tokens", headers: [["authorization", "Bearer x"], ["content-type", "application/json"]],
    content: hex(Buffer.from(body)) });
  const response = decodeBhttpResponse(await open(fromHex(out.enc_response)));
  assert.deepEqual(response, { status: 200, headers: [["content-type", "application/json"]],
    body: Uint8Array.from(content) });
  const tampered = fromHex(out.enc_response);
  tampered[20] ^= 1;
  await assert.rejects(open(tampered), /does not decrypt/);
  const again = await ohttpEncapsulate(config, request);
  assert.notEqual(hex(again.encRequest), hex(encRequest), "a fresh ephemeral key each request");
  const broken = Uint8Array.from(again.encRequest);
  broken[100] ^= 1;
  assert.match(python({ op: "serve", key, enc_request: hex(broken), status: 200, headers: [], content: "" }).error,
    /DecryptError/);
});

test("ohttpFetch: a whole request through a relay to the Python gateway, answered as a Response", needsPython,
  async () => {
    const { config, key, keys } = python({ op: "key" });
    const seen = [];
    const relay = async (url, init) => { // the relay and the gateway in one: what it sees is ciphertext only
      seen.push({ url, init });
      if (url === "https://relay.example/ohttp-keys") return new Response(fromHex(keys), { status: 200 });
      assert.equal(url, "https://relay.example/ohttp");
      assert.deepEqual(init.headers, { "Content-Type": "message/ohttp-req" });
      assert.equal(init.credentials, "omit");
      const out = python({ op: "serve", key, enc_request: hex(new Uint8Array(init.body)), status: 409,
        headers: [["content-type", "application/json"], ["retry-after", "30"]],
        content: hex(Buffer.from('{"error": {"code": "too_few_tokens", "message": "later"}}')) });
      seen.at(-1).inner = out.request;
      return new Response(fromHex(out.enc_response), { status: 200, headers: { "Content-Type": "message/ohttp-res" } });
    };
    assert.equal(await fetchOhttpKeys(relay, "https://relay.example/"), config);
    const fetchFn = ohttpFetch("https://relay.example/ohttp", config, { fetch: relay });
    assert.equal(fetchFn.keyConfig, config);
    const resp = await fetchFn("https://dp.example/api/v1/rounds/r1/reports", { method: "POST",
      headers: { "Content-Type": "application/json" }, body: '{"id": "x"}' });
    assert.equal(resp.status, 409);
    assert.equal(resp.headers.get("Retry-After"), "30");
    assert.deepEqual(await resp.json(), { error: { code: "too_few_tokens", message: "later" } });
    const { inner } = seen.at(-1);
    assert.equal(inner.method, "POST");
    assert.equal(inner.path, "/api/v1/rounds/r1/reports");
    assert.equal(Buffer.from(fromHex(inner.content)).toString(), '{"id": "x"}');
    assert.ok(!Buffer.from(new Uint8Array(seen.at(-1).init.body)).toString("latin1").includes("reports"),
      "the relay sees no path");
    const bad = async () => new Response("no", { status: 502 });
    await assert.rejects(ohttpFetch("https://relay.example/ohttp", config, { fetch: bad })("https://dp.example/x"),
      (exc) => exc instanceof DeviceError && /HTTP 502/.test(exc.message));
  });
