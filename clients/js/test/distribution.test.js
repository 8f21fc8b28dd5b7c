// 10^6 randomizations per input fit Python's exact output_distribution (chi-square, p > 1e-6). The draws go
// through the production source (systemSource) over seeded bytes (support.seededBytes), so the tests are
// deterministic; a sampler with slightly wrong keep probabilities fails the same test.
import assert from "node:assert/strict";
import { test } from "node:test";

import { DeviceHeadList, localAlg } from "../hybriddp-device.js";
import { chi2Sf, chiSquarePooled, loadFixtures, needsFixtures, seededSource } from "./support.js";

const fx = loadFixtures();
const P_MIN = 1e-6;

test("the chi-square tail probability matches scipy's", needsFixtures(fx), () => {
  for (const [stat, df, p] of fx.chi2) {
    const mine = chi2Sf(stat, df);
    assert.ok(Math.abs(mine - p) <= 1e-10 * Math.max(p, 1e-300) + 1e-300, `chi2.sf(${stat}, ${df}) = ${p}, got ${mine}`);
  }
});

test("the chi-square check has power: a sampler that keeps the record too often fails", () => {
  // kept with probability 0.52 instead of 0.5 (four outcomes), 10^6 samples
  const probs = [0.5, 0.2, 0.2, 0.1];
  const counts = [520000, 192000, 192000, 96000];
  assert.ok(chiSquarePooled(counts, probs).p < 1e-30);
  assert.ok(chiSquarePooled([500100, 199950, 200000, 99950], probs).p > 0.5);
});

/** Chi-square of `d.samples` randomizations of d's record by localAlg over hl (from source) against d.probs. */
function sampleFit(d, hl, source) {
  const [qi, ui] = hl.encode(d.record[0], d.record[1]);
  const width = Math.max(...hl.kq);
  const raw = new Float64Array(hl.k * width);
  for (let n = 0; n < d.samples; n++) {
    const [q2, u2] = localAlg(qi, ui, hl, source);
    raw[q2 * width + u2]++;
  }
  const index = new Map(d.outcomes.map((o, i) => [JSON.stringify([o.query, o.url]), i]));
  const counts = new Array(d.outcomes.length).fill(0);
  raw.forEach((c, key) => {
    if (!c) return;
    const rep = hl.decode(Math.floor(key / width), key % width);
    const i = index.get(JSON.stringify([rep.query, rep.url]));
    assert.ok(i !== undefined, `report ${JSON.stringify(rep)} is not an outcome`);
    counts[i] += c;
  });
  assert.equal(counts.reduce((s, x) => s + x, 0), d.samples);
  return chiSquarePooled(counts, d.probs);
}

(fx ? fx.distributions : [{ what: "(no fixtures)" }]).forEach((d, i) => {
  const name = fx ? `${fx.headlists[d.headlist].name}: ${d.what}` : d.what;
  test(`10^6 seeded samples fit output_distribution — ${name}`, needsFixtures(fx), async (t) => {
    const hl = await DeviceHeadList.fromJSON(fx.headlists[d.headlist].text);
    const { stat, df, p } = sampleFit(d, hl, seededSource(`distribution ${i}`));
    t.diagnostic(`chi-square ${stat} on ${df} df, p = ${p}`);
    assert.ok(df >= 1, "at least two cells");
    assert.ok(p > P_MIN, `chi-square ${stat} on ${df} df, p = ${p}`);
  });
});

test("the sampling test has teeth: keep probabilities off by 5% of 1 − t fail it (same seeds)", needsFixtures(fx),
  async (t) => {
    for (const [i, d] of fx.distributions.entries()) {
      const hl = await DeviceHeadList.fromJSON(fx.headlists[d.headlist].text);
      // the same head list (frozen), but reporting another query 5% more often than it should
      const biased = Object.create(hl, { oneMinusT: { value: hl.oneMinusT * 1.05 } });
      const { stat, df, p } = sampleFit(d, biased, seededSource(`distribution ${i}`));
      t.diagnostic(`${fx.headlists[d.headlist].name}: ${d.what}: biased, chi-square ${stat} on ${df} df, p = ${p}`);
      assert.ok(p < P_MIN, `a sampler with 1 − t too large by 5% passed: p = ${p}`);
    }
  });
