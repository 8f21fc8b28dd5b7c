// The system source (crypto.getRandomValues): uniform integers without modulo bias, 53-bit uniforms;
// message ids; the plain-JS SHA-256 used where crypto.subtle is missing.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";

import { checkMessageId, newMessageId, replaySource, sha256Hex, systemSource } from "../hybriddp-device.js";
import { chiSquarePooled } from "./support.js";

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

test("below(n) is uniform on [0, n) (chi-square, p > 1e-6), up to n near 2^53", () => {
  const src = systemSource();
  assert.equal(src.below(1), 0);
  for (const [n, buckets] of CASES) {
    const { p } = chiSquarePooled(bucketCounts((m) => src.below(m), n, buckets, 200000), new Array(buckets).fill(
      1 / buckets));
    assert.ok(p > P_MIN, `below(${n}): p = ${p}`);
  }
  for (const bad of [0, -1, 1.5, 2 ** 53, NaN]) assert.throws(() => src.below(bad), /positive safe integer/);
});

test("the uniformity check has power: modulo reduction of 32 random bits fails it", () => {
  const src = systemSource();
  const n = 3 * 2 ** 30;
  const modulo = (m) => (src.below(2 ** 32)) % m; // 2^32 mod n = 2^30: [0, 2^30) twice as likely
  const { p } = chiSquarePooled(bucketCounts(modulo, n, 192, 200000), new Array(192).fill(1 / 192));
  assert.ok(p < 1e-30, `p = ${p}`);
});

test("uniform() has 53 random bits and is uniform on [0, 1)", () => {
  const src = systemSource();
  const n = 400000;
  const counts = new Array(100).fill(0);
  let lowBits = 0;
  for (let i = 0; i < n; i++) {
    const u = src.uniform();
    assert.ok(u >= 0 && u < 1);
    const m = u * 2 ** 53;
    assert.ok(Number.isInteger(m));
    lowBits += m % 2;
    counts[Math.floor(u * 100)]++;
  }
  assert.ok(chiSquarePooled(counts, new Array(100).fill(0.01)).p > P_MIN);
  // the lowest of the 53 bits is a fair coin: |ones − n/2| < 5.5 standard deviations (p < 4e-8)
  assert.ok(Math.abs(lowBits - n / 2) < 5.5 * Math.sqrt(n / 4), `${lowBits} of ${n}`);
});

test("replaySource replays: uniform() in order, below(n) = floor(v·n), then refuses", () => {
  const src = replaySource([0.5, 0.999, 0.25, 0]);
  assert.equal(src.uniform(), 0.5);
  assert.equal(src.below(10), 9);
  assert.equal(src.below(3), 0);
  assert.equal(src.below(7), 0);
  assert.throws(() => src.uniform(), /used up/);
});

test("newMessageId: 16 random bytes in URL-safe base64 without padding", () => {
  const ids = new Set();
  const byteCounts = new Array(256).fill(0);
  for (let i = 0; i < 20000; i++) {
    const id = newMessageId();
    assert.match(id, /^[A-Za-z0-9_-]{22}$/);
    assert.equal(checkMessageId(id), id);
    const bytes = Buffer.from(id, "base64url");
    assert.equal(bytes.length, 16);
    assert.equal(bytes.toString("base64url"), id);
    bytes.forEach((b) => byteCounts[b]++);
    ids.add(id);
  }
  assert.equal(ids.size, 20000);
  assert.ok(chiSquarePooled(byteCounts, new Array(256).fill(1 / 256)).p > P_MIN);
  const fixed = (b) => ({ bytes: (n) => new Uint8Array(n).fill(b) });
  assert.equal(newMessageId(fixed(0)), "AAAAAAAAAAAAAAAAAAAAAA");
  assert.equal(newMessageId(fixed(255)), "_____________________w"); // Python: urlsafe_b64encode(b"\xff" * 16)
  for (let i = 0; i < 100; i++) {
    const src = systemSource();
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
  const src = systemSource();
  assert.equal(sha256Hex(new TextEncoder().encode("abc")),
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  for (const len of [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 70000]) {
    const bytes = src.bytes(len);
    assert.equal(sha256Hex(bytes), createHash("sha256").update(bytes).digest("hex"), `${len} bytes`);
  }
});
