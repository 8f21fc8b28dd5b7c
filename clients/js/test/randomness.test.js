// The system source: uniform integers without modulo bias, 53-bit uniforms; message ids; the plain-JS
// SHA-256 used where crypto.subtle is missing. The statistical tests run the production conversion code
// (systemSource) over seeded bytes (support.seededBytes), so they are deterministic; one smoke test checks
// the default source (crypto.getRandomValues) by shape and range only.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";

import { checkMessageId, newMessageId, replaySource, sha256Hex, systemSource } from "../hybriddp-device.js";
import { chiSquarePooled, seededBytes, seededSource } from "./support.js";

const P_MIN = 1e-6;

/** counts of ⌊r·buckets/n⌋ over `samples` draws of draw(n) (n a multiple of buckets). */
function bucketCounts(draw, n, buckets, samples) {
  const width = n / buckets;
  assert.ok(Number.isInteger(width));
  const counts = new Array(buckets).fill(0);
  for (let i = 0; i < samples; i++) {
    const r = draw(n);
    assert.ok(Number.isInteger(r) && r >= 0 && r < n, `${r} out of [0, ${n})`);
    counts[Math.floor(r / width)]++;
  }
  return counts;
}

const CASES = [[2, 2], [3, 3], [7, 7], [10, 10], [1000, 1000], [3 * 2 ** 30, 192], [2 ** 32, 256],
  [3 * 2 ** 40, 192], [15 * 2 ** 48, 240]];

test("the default source (crypto.getRandomValues) works: shapes and ranges", () => {
  const src = systemSource();
  for (let i = 0; i < 5000; i++) { // more than one pool of 1024 words
    const u = src.uniform();
    assert.ok(u >= 0 && u < 1 && Number.isInteger(u * 2 ** 53), `uniform() = ${u}`);
    const n = [2, 7, 3 * 2 ** 30, 2 ** 32, 15 * 2 ** 48][i % 5];
    const r = src.below(n);
    assert.ok(Number.isInteger(r) && r >= 0 && r < n, `below(${n}) = ${r}`);
  }
  const big = src.bytes(70000); // more than crypto.getRandomValues gives per call
  assert.ok(big instanceof Uint8Array && big.length === 70000);
  assert.notDeepEqual(big.subarray(0, 16), big.subarray(69984)); // equal with probability 2^-128
  const id = newMessageId();
  assert.equal(checkMessageId(id), id);
  assert.notEqual(newMessageId(), id);
});

test("systemSource refuses a getRandomValues that is not a function", () => {
  for (const bad of [null, 12, "crypto", {}]) {
    assert.throws(() => systemSource({ getRandomValues: bad }), /getRandomValues must be a function/);
  }
  assert.equal(typeof systemSource({}).uniform(), "number");
});

test("a seeded source is the production code over a reproducible byte stream", () => {
  const draw = (src) => [src.uniform(), src.below(1000), src.below(15 * 2 ** 48), ...src.bytes(20)];
  assert.deepEqual(draw(seededSource("same")), draw(seededSource("same")));
  assert.notDeepEqual(draw(seededSource("same")), draw(seededSource("other")));
  // uniform() is two 32-bit words of the stream, top 27 and 26 bits (native byte order, as Uint32Array)
  const words = new Uint32Array(2);
  seededBytes("words")(words);
  assert.equal(seededSource("words").uniform(), ((words[0] >>> 5) * 2 ** 26 + (words[1] >>> 6)) / 2 ** 53);
});

test("below(n) is uniform on [0, n) (chi-square, p > 1e-6), up to n near 2^53", (t) => {
  const src = seededSource("below");
  assert.equal(src.below(1), 0);
  for (const [n, buckets] of CASES) {
    const { stat, df, p } = chiSquarePooled(bucketCounts((m) => src.below(m), n, buckets, 200000),
      new Array(buckets).fill(1 / buckets));
    t.diagnostic(`below(${n}): chi-square ${stat} on ${df} df, p = ${p}`);
    assert.ok(p > P_MIN, `below(${n}): p = ${p}`);
  }
  for (const bad of [0, -1, 1.5, 2 ** 53, NaN]) assert.throws(() => src.below(bad), /positive safe integer/);
});

test("the uniformity check has power: modulo reduction of 32 random bits fails it", () => {
  const src = seededSource("below, modulo");
  const n = 3 * 2 ** 30;
  const modulo = (m) => (src.below(2 ** 32)) % m; // 2^32 mod n = 2^30: [0, 2^30) twice as likely
  const { p } = chiSquarePooled(bucketCounts(modulo, n, 192, 200000), new Array(192).fill(1 / 192));
  assert.ok(p < 1e-30, `p = ${p}`);
});

/** p of 100 equal buckets (chi-square) and z of the lowest of 53 bits (a fair coin) over n draws of uniform(). */
function uniformCheck(uniform, n) {
  const counts = new Array(100).fill(0);
  let lowBits = 0;
  for (let i = 0; i < n; i++) {
    const u = uniform();
    assert.ok(u >= 0 && u < 1);
    const m = u * 2 ** 53;
    assert.ok(Number.isInteger(m));
    lowBits += m % 2;
    counts[Math.floor(u * 100)]++;
  }
  return { p: chiSquarePooled(counts, new Array(100).fill(0.01)).p, z: (lowBits - n / 2) / Math.sqrt(n / 4) };
}

test("uniform() has 53 random bits and is uniform on [0, 1)", (t) => {
  const src = seededSource("uniform");
  const { p, z } = uniformCheck(() => src.uniform(), 400000);
  t.diagnostic(`buckets p = ${p}, lowest bit z = ${z}`);
  assert.ok(p > P_MIN, `p = ${p}`);
  // the lowest of the 53 bits is a fair coin: |z| < 5.5 standard deviations (p < 4e-8)
  assert.ok(Math.abs(z) < 5.5, `z = ${z}`);
});

test("the uniform() check has power: 52 random bits, or u^1.1, fail it", () => {
  const src = seededSource("uniform, biased");
  const bits52 = uniformCheck(() => Math.floor(src.uniform() * 2 ** 52) / 2 ** 52, 400000);
  assert.ok(Math.abs(bits52.z) > 5.5, `z = ${bits52.z}`);
  const skewed = uniformCheck(() => Math.floor(src.uniform() ** 1.1 * 2 ** 53) / 2 ** 53, 400000);
  assert.ok(skewed.p < 1e-30, `p = ${skewed.p}`);
});

test("replaySource replays: uniform() in order, below(n) = floor(v·n), then refuses", () => {
  const src = replaySource([0.5, 0.999, 0.25, 0]);
  assert.equal(src.uniform(), 0.5);
  assert.equal(src.below(10), 9);
  assert.equal(src.below(3), 0);
  assert.equal(src.below(7), 0);
  assert.throws(() => src.uniform(), /used up/);
});

/** The ids of `count` newMessageId(source) calls and the chi-square p of their bytes against uniform. */
function messageIdBytes(source, count) {
  const ids = new Set();
  const byteCounts = new Array(256).fill(0);
  for (let i = 0; i < count; i++) {
    const id = newMessageId(source);
    assert.match(id, /^[A-Za-z0-9_-]{22}$/);
    assert.equal(checkMessageId(id), id);
    const bytes = Buffer.from(id, "base64url");
    assert.equal(bytes.length, 16);
    assert.equal(bytes.toString("base64url"), id);
    bytes.forEach((b) => byteCounts[b]++);
    ids.add(id);
  }
  return { ids, p: chiSquarePooled(byteCounts, new Array(256).fill(1 / 256)).p };
}

test("newMessageId: 16 random bytes in URL-safe base64 without padding", (t) => {
  const { ids, p } = messageIdBytes(seededSource("message ids"), 20000);
  t.diagnostic(`bytes p = ${p}`);
  assert.equal(ids.size, 20000);
  assert.ok(p > P_MIN, `p = ${p}`);
  // the check has power: bytes where 255 is replaced by 0 (0 twice as likely, 255 never) fail it
  const fill = seededBytes("message ids, biased");
  const biased = systemSource({
    getRandomValues: (array) => {
      fill(array);
      const view = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
      view.forEach((b, i) => {
        if (b === 255) view[i] = 0;
      });
    },
  });
  assert.ok(messageIdBytes(biased, 20000).p < 1e-30);
  const fixed = (b) => ({ bytes: (n) => new Uint8Array(n).fill(b) });
  assert.equal(newMessageId(fixed(0)), "AAAAAAAAAAAAAAAAAAAAAA");
  assert.equal(newMessageId(fixed(255)), "_____________________w"); // Python: urlsafe_b64encode(b"\xff" * 16)
  const src = seededSource("message id encoding");
  for (let i = 0; i < 100; i++) {
    const raw = src.bytes(16);
    assert.equal(newMessageId({ bytes: () => raw }), Buffer.from(raw).toString("base64url"));
  }
});

test("checkMessageId refuses what Python's check_message_id refuses", () => {
  for (const bad of ["A".repeat(21), "A".repeat(23), `${"A".repeat(21)}+`, `${"A".repeat(21)}=`, `${"A".repeat(21)}é`,
    null, 12, ["A".repeat(22)]]) {
    assert.throws(() => checkMessageId(bad), /message id .* is not valid: it must be 16 random bytes/);
  }
});

test("the plain-JS SHA-256 equals node's", () => {
  const src = seededSource("sha256");
  assert.equal(sha256Hex(new TextEncoder().encode("abc")),
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  for (const len of [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 70000]) {
    const bytes = src.bytes(len);
    assert.equal(sha256Hex(bytes), createHash("sha256").update(bytes).digest("hex"), `${len} bytes`);
  }
});
