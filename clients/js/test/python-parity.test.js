// The JS device gives the Python device's answers: hashes, thresholds, float formatting, messages from uniforms.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  canonicalJson, contentHash, DeviceHeadList, DeviceLedger, LEDGER_KEY, listsHash, maxEpsilon, pyFloatRepr,
  randomizeRecords, replaySource, ROUND_COMMITMENTS,
} from "../hybriddp-device.js";
import { loadFixtures, memoryStorage, needsFixtures } from "./support.js";

const fx = loadFixtures();

test("head lists written by Python: same canonical JSON, content hash and thresholds", needsFixtures(fx), async () => {
  for (const h of fx.headlists) {
    const obj = JSON.parse(h.text);
    assert.equal(canonicalJson(obj), h.canonical, h.name);
    assert.equal(canonicalJson(h.text), h.canonical, h.name);
    assert.equal(await contentHash(obj), h.hash, h.name);
    assert.equal(await contentHash(h.text), h.hash, h.name);
    for (const input of [h.text, obj]) {
      const hl = await DeviceHeadList.fromJSON(input);
      assert.equal(hl.k, h.k);
      assert.deepEqual(hl.kq, h.kq);
      assert.equal(hl.contentHash, h.hash);
      // same IEEE operations; Math.exp and the C library's exp agree to the last bit on these inputs
      assert.equal(hl.oneMinusT, h.one_minus_t, h.name);
      assert.deepEqual(hl.oneMinusTq, h.one_minus_tq, h.name);
    }
  }
});

test("max_epsilon as Python computes it", needsFixtures(fx), () => {
  for (const [fC, mC, expected] of fx.max_epsilon) assert.equal(maxEpsilon(fC, mC), expected, `${fC} ${mC}`);
  for (const h of fx.headlists) {
    const doc = JSON.parse(h.text);
    assert.equal(maxEpsilon(doc.f_c, doc.m_c), h.max_epsilon, h.name);
  }
});

test("floats are written as Python's json.dumps writes them", needsFixtures(fx), () => {
  let checked = 0;
  for (const [value, repr] of fx.float_reprs) {
    assert.equal(pyFloatRepr(value), repr, `${value}`);
    checked++;
  }
  assert.ok(checked > 500);
});

function countingReplay(values) {
  const src = replaySource(values);
  const counter = {
    used: 0,
    uniform: () => (counter.used++, src.uniform()),
    below: (n) => (counter.used++, src.below(n)),
  };
  return counter;
}

test("identical uniforms give the Python device's message, drawn in the same order", needsFixtures(fx), async () => {
  const hls = await Promise.all(fx.headlists.map((h) => DeviceHeadList.fromJSON(h.text)));
  const byKind = { listed: 0, qStar: 0, starStar: 0, changed: 0 };
  for (const r of fx.replays) {
    const src = countingReplay(r.uniforms);
    const msg = await randomizeRecords(hls[r.headlist], r.records, { source: src, messageId: r.message_id });
    assert.deepEqual(msg, r.expected, JSON.stringify(r.records));
    assert.equal(src.used, r.used, "the number of draws");
    for (const [q, u] of r.records) {
      const [qi, ui] = hls[r.headlist].encode(q, u);
      const rep = hls[r.headlist].decode(qi, ui);
      if (rep.query === null) byKind.starStar++;
      else if (rep.url === null || rep.url !== u) byKind.qStar++;
      else byKind.listed++;
    }
    byKind.changed += msg.reports.some((x, i) => JSON.stringify(x) !== JSON.stringify(
      hls[r.headlist].decode(...hls[r.headlist].encode(...r.records[i] ?? ["", null])))) ? 1 : 0;
  }
  // the fixture covers every kind of record, and randomization changed some reports
  assert.ok(byKind.listed > 50 && byKind.qStar > 50 && byKind.starStar > 50, JSON.stringify(byKind));
  assert.ok(fx.replays.length >= 1000);
});

test("a head list given as an object, as text or as a DeviceHeadList gives the same message", needsFixtures(fx),
  async () => {
    for (const r of fx.replays.slice(0, 60)) {
      const text = fx.headlists[r.headlist].text;
      for (const hl of [text, JSON.parse(text)]) {
        const msg = await randomizeRecords(hl, r.records, { source: replaySource(r.uniforms), messageId: r.message_id });
        assert.deepEqual(msg, r.expected);
      }
    }
  });

test("lists hash (protocol v2): Python's lists_hash, with and without round commitments", needsFixtures(fx),
  async () => {
    assert.deepEqual([...ROUND_COMMITMENTS], ["token_key", "ohttp_key", "report_window"]);
    const { cases } = fx.lists_hashes;
    assert.ok(cases.some((c) => c.lists_hash === c.content_hash) && cases.some((c) => c.lists_hash !== c.content_hash));
    for (const c of cases) {
      const obj = JSON.parse(c.text);
      assert.equal(await listsHash(obj), c.lists_hash, c.name);
      assert.equal(await listsHash(c.text), c.lists_hash, c.name);
      for (const input of [c.text, obj]) {
        const hl = await DeviceHeadList.fromJSON(input);
        assert.equal(hl.contentHash, c.content_hash, c.name);
        assert.equal(hl.listsHash, c.lists_hash, c.name);
      }
    }
  });

test("a message made with a ledger: the ledger is keyed by the lists hash, the message names the content hash; "
  + "the same lists in the next round are memoized as Python memoizes them", needsFixtures(fx), async () => {
  const m = fx.lists_hashes.memo;
  const storage = memoryStorage();
  const ledger = new DeviceLedger(storage, { lifetimeEpsilon: 100, lifetimeDelta: 0.5 });
  const docs = m.rounds.map((i) => fx.lists_hashes.cases[i]);
  const first = await randomizeRecords(docs[0].text, m.records, {
    source: replaySource(m.uniforms), ledger, messageId: m.message_ids[0], roundId: m.round_ids[0],
  });
  assert.deepEqual(first, m.messages[0]);
  assert.equal(first.headlist, docs[0].content_hash);
  const spent = ledger.spent();
  const second = await randomizeRecords(docs[1].text, m.records, {
    source: replaySource([]), ledger, messageId: m.message_ids[1], roundId: m.round_ids[1],
  });
  assert.deepEqual(second, m.messages[1]);
  assert.equal(second.headlist, docs[1].content_hash);
  assert.deepEqual(ledger.spent(), spent, "the memoized message is not charged again");
  const state = JSON.parse(storage.map.get(LEDGER_KEY));
  assert.deepEqual(Object.keys(state.rounds).sort(), m.ledger_rounds);
  assert.deepEqual(Object.keys(state.memo).sort(), m.ledger_memo);
  assert.deepEqual(m.ledger_rounds, [docs[0].lists_hash]);
  assert.deepEqual(state.memo[docs[0].lists_hash].sent_in, m.sent_in);
});
