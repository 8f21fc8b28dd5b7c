// Shared helpers of the node tests: the Python fixtures, seeded random bytes and a chi-square test written out here.
import { createCipheriv, createHash, webcrypto } from "node:crypto";
import { readFileSync } from "node:fs";

import { systemSource } from "../hybriddp-device.js";

// Node 18 has Web Crypto only as node:crypto's webcrypto; browsers and Node 19+ have globalThis.crypto.
if (!globalThis.crypto) globalThis.crypto = webcrypto;

/** The fixtures Python wrote (tests/test_js_device.py), or null when HYBRIDDP_JS_FIXTURES is not set. */
export function loadFixtures() {
  const path = process.env.HYBRIDDP_JS_FIXTURES;
  return path ? JSON.parse(readFileSync(path, "utf8")) : null;
}

/** Options for node:test: skip (saying why) when there are no fixtures; pytest asserts nothing is skipped. */
export const needsFixtures = (fixtures) => (fixtures ? {} : {
  skip: "HYBRIDDP_JS_FIXTURES is not set: run `pytest tests/test_js_device.py`, which writes the fixtures",
});

const ZEROS = new Uint8Array(65536);

/**
 * A seeded, deterministic stand-in for crypto.getRandomValues: fills a typed array in place with
 * the AES-256-CTR keystream under key SHA-256("hybriddp JS test bytes: " + seed), zero IV, one
 * continuous stream across calls. The same seed gives the same bytes on every run, so the
 * statistical tests never flake, and the bytes are cryptographically strong, so a test failure
 * means the code under test, not the generator (~1 GB/s: 10^7 uniforms take milliseconds).
 */
export function seededBytes(seed) {
  const key = createHash("sha256").update(`hybriddp JS test bytes: ${seed}`).digest();
  const cipher = createCipheriv("aes-256-ctr", key, Buffer.alloc(16));
  return (array) => {
    const view = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
    for (let i = 0; i < view.length; i += ZEROS.length) {
      const part = cipher.update(ZEROS.subarray(0, Math.min(ZEROS.length, view.length - i)));
      view.set(part, i);
    }
    return array;
  };
}

/** The production source (systemSource) over the seeded bytes of seededBytes(seed). */
export const seededSource = (seed) => systemSource({ getRandomValues: seededBytes(seed) });

/** ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; relative error ~1e-15). */
export function lnGamma(x) {
  const c = [0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
    -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
    1.5056327351493116e-7];
  if (x < 0.5) return Math.log(Math.PI / Math.sin(Math.PI * x)) - lnGamma(1 - x);
  const z = x - 1;
  let s = c[0];
  for (let i = 1; i < 9; i++) s += c[i] / (z + i);
  const t = z + 7.5;
  return 0.5 * Math.log(2 * Math.PI) + (z + 0.5) * Math.log(t) - t + Math.log(s);
}

/** Q(a, x) = Γ(a, x)/Γ(a), the regularized upper incomplete gamma function (series / continued fraction). */
export function gammaQ(a, x) {
  if (!(a > 0) || !(x >= 0)) throw new RangeError(`gammaQ(${a}, ${x})`);
  if (x === 0) return 1;
  const front = Math.exp(-x + a * Math.log(x) - lnGamma(a));
  if (x < a + 1) { // P(a, x) by its series, Q = 1 − P
    let ap = a;
    let del = 1 / a;
    let sum = del;
    for (let n = 0; n < 100000 && Math.abs(del) > Math.abs(sum) * 1e-17; n++) {
      ap += 1;
      del *= x / ap;
      sum += del;
    }
    return 1 - sum * front;
  }
  const tiny = 1e-300; // Q by its continued fraction (modified Lentz)
  let b = x + 1 - a;
  let c = 1 / tiny;
  let d = 1 / b;
  let h = d;
  for (let i = 1; i < 100000; i++) {
    const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (Math.abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (Math.abs(c) < tiny) c = tiny;
    d = 1 / d;
    const del = d * c;
    h *= del;
    if (Math.abs(del - 1) < 1e-16) break;
  }
  return front * h;
}

/** Upper tail probability of the chi-square distribution with df degrees of freedom. */
export const chi2Sf = (stat, df) => gammaQ(df / 2, stat / 2);

/**
 * Chi-square goodness-of-fit p-value of counts against probabilities. Cells with expected count < 5
 * are pooled into one (as tests/test_localalg.py does); a cell of probability 0 must have count 0.
 */
export function chiSquarePooled(counts, probs) {
  const total = counts.reduce((s, x) => s + x, 0);
  const obs = [];
  const exp = [];
  let smallObs = 0;
  let smallExp = 0;
  counts.forEach((o, i) => {
    if (probs[i] === 0 && o !== 0) throw new Error(`cell ${i} has probability 0 but ${o} samples`);
    const e = probs[i] * total;
    if (e < 5) {
      smallObs += o;
      smallExp += e;
    } else {
      obs.push(o);
      exp.push(e);
    }
  });
  if (smallExp > 0) {
    obs.push(smallObs);
    exp.push(smallExp);
  }
  const scale = obs.reduce((s, x) => s + x, 0) / exp.reduce((s, x) => s + x, 0);
  let stat = 0;
  exp.forEach((e, i) => {
    const ee = e * scale;
    stat += (obs[i] - ee) ** 2 / ee;
  });
  return { stat, df: obs.length - 1, p: obs.length > 1 ? chi2Sf(stat, obs.length - 1) : 1 };
}

/** A storage object like localStorage, backed by a Map. */
export function memoryStorage() {
  const map = new Map();
  return {
    map,
    getItem: (k) => (map.has(k) ? map.get(k) : null),
    setItem: (k, v) => {
      map.set(k, String(v));
    },
    removeItem: (k) => {
      map.delete(k);
    },
  };
}
