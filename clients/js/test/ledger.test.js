// The device ledger: one report per head list, a lifetime budget, state persisted in a storage object.
import assert from "node:assert/strict";
import { test } from "node:test";

import { DeviceError, DeviceLedger, LEDGER_KEY, randomizeRecords, recordsKey, replaySource } from "../hybriddp-device.js";
import { loadFixtures, memoryStorage, needsFixtures } from "./support.js";

const fx = loadFixtures();
const H1 = `sha256:${"1".repeat(64)}`;
const H2 = `sha256:${"2".repeat(64)}`;
const H3 = `sha256:${"3".repeat(64)}`;

test("a new ledger needs its lifetime budget, checked", () => {
  const storage = memoryStorage();
  assert.throws(() => new DeviceLedger(storage), /does not exist; to create it give the device's lifetime budget/);
  assert.throws(() => new DeviceLedger(storage, { lifetimeEpsilon: 5 }), DeviceError);
  for (const [e, d] of [[0, 1e-3], [-1, 1e-3], [Infinity, 1e-3], [NaN, 1e-3], ["5", 1e-3], [5, 0], [5, 1], [5, "x"]]) {
    assert.throws(() => new DeviceLedger(storage, { lifetimeEpsilon: e, lifetimeDelta: d }),
      (exc) => exc instanceof DeviceError && /lifetime (epsilon|delta)/.test(exc.message), `${e} ${d}`);
  }
  assert.equal(storage.map.size, 0, "nothing written before the first report");
  assert.throws(() => new DeviceLedger(null, { lifetimeEpsilon: 5, lifetimeDelta: 1e-3 }), /no storage/);
});

test("one report per head list; the state persists in the storage", () => {
  const storage = memoryStorage();
  const ledger = new DeviceLedger(storage, { lifetimeEpsilon: 10, lifetimeDelta: 1e-3 });
  assert.deepEqual(ledger.spent(), { epsilon: 0, delta: 0 });
  ledger.record(H1, 2, 1e-5);
  assert.ok(ledger.hasReported(H1));
  assert.throws(() => ledger.record(H1, 2, 1e-5), /already reported for head list sha256:1111111111/);
  assert.throws(() => ledger.check(H1, 0.001, 0), /at most once per round/);
  assert.deepEqual(JSON.parse(storage.map.get(LEDGER_KEY)),
    { lifetime: { epsilon: 10, delta: 1e-3 }, rounds: { [H1]: { epsilon: 2, delta: 1e-5 } } });
  const again = new DeviceLedger(storage); // e.g. the page loaded again
  assert.deepEqual(again.spent(), { epsilon: 2, delta: 1e-5 });
  assert.deepEqual(again.lifetime, { epsilon: 10, delta: 1e-3 });
  assert.throws(() => again.record(H1, 1, 0), DeviceError);
  assert.throws(() => new DeviceLedger(storage, { lifetimeEpsilon: 20, lifetimeDelta: 1e-3 }),
    /lifetime epsilon 10.0, not 20: a device's lifetime budget is fixed/);
  new DeviceLedger(storage, { lifetimeEpsilon: 10, lifetimeDelta: 1e-3 }); // the same budget is fine
});

test("the lifetime budget: a report that would pass it is refused and charges nothing", () => {
  const storage = memoryStorage();
  const ledger = new DeviceLedger(storage, { lifetimeEpsilon: 2.5, lifetimeDelta: 1e-4 });
  ledger.record(H1, 1, 1e-5);
  ledger.record(H2, 1, 1e-5);
  const before = storage.map.get(LEDGER_KEY);
  assert.throws(() => ledger.record(H3, 1, 1e-5), /exceed this device's lifetime budget \(epsilon 2.5, delta 0.0001; spent 2, 2e-05\)/);
  assert.equal(storage.map.get(LEDGER_KEY), before);
  assert.equal(ledger.hasReported(H3), false);
  ledger.record(H3, 0.5, 1e-5); // exactly up to the budget is allowed
  assert.deepEqual(ledger.spent(), { epsilon: 2.5, delta: 3.0000000000000004e-05 }); // Python: math.fsum([1e-5] * 3)
  const d = new DeviceLedger(memoryStorage(), { lifetimeEpsilon: 100, lifetimeDelta: 3e-5 });
  d.record(H1, 1, 1e-5);
  d.record(H2, 1, 2e-5); // δ: 1e-5 + 2e-5 = 3e-5 within round-off
  assert.throws(() => d.record(H3, 1, 1e-12), /lifetime budget/);
  const sums = new DeviceLedger(memoryStorage(), { lifetimeEpsilon: 0.3, lifetimeDelta: 0.5 });
  sums.record(H1, 0.1, 0);
  sums.record(H2, 0.2, 0); // 0.1 + 0.2 > 0.3 in doubles, but within the 1e-12 relative slack
  assert.equal(sums.spent().epsilon, 0.30000000000000004);
});

test("spent() sums exactly (as Python's math.fsum)", () => {
  const ledger = new DeviceLedger(memoryStorage(), { lifetimeEpsilon: 1e30, lifetimeDelta: 0.5 });
  ledger.record(H1, 1e20, 0);
  ledger.record(H2, 1, 0);
  ledger.record(H3, -1e20 + 1e20, 0);
  ledger.record("sha256:4", 0.1, 0);
  assert.equal(ledger.spent().epsilon, 1e20 + 1); // naive left-to-right would also do; check a harder one:
  const l2 = new DeviceLedger(memoryStorage(), { lifetimeEpsilon: 1e30, lifetimeDelta: 0.5 });
  [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1].forEach((x, i) => l2.record(`h${i}`, x, 0));
  assert.equal(l2.spent().epsilon, 1.0); // naive summation gives 0.9999999999999999
});

test("a storage that fails to write: nothing charged, nothing reported", async () => {
  const storage = memoryStorage();
  const ledger = new DeviceLedger(storage, { lifetimeEpsilon: 10, lifetimeDelta: 1e-3 });
  storage.setItem = () => {
    throw new Error("QuotaExceededError");
  };
  assert.throws(() => ledger.record(H1, 1, 1e-5), /cannot write device ledger.*QuotaExceededError.*nothing was charged/);
  assert.equal(ledger.hasReported(H1), false);
  assert.deepEqual(ledger.spent(), { epsilon: 0, delta: 0 });
});

test("a damaged ledger in storage is refused, naming what is wrong", () => {
  for (const [data, needle] of [["", "is empty"], ["{", "not valid JSON"], ["[]", "expected a JSON object"],
    ['{"lifetime": {}, "rounds": {}}', "has no 'epsilon'"],
    ['{"lifetime": {"epsilon": -1, "delta": 0.1}, "rounds": {}}', "lifetime.epsilon = -1 is not allowed"],
    ['{"lifetime": {"epsilon": 1, "delta": "x"}, "rounds": {}}', "lifetime.delta = 'x' is a string"],
    ['{"lifetime": {"epsilon": 1, "delta": 0.1}, "rounds": {"h": 3}}', "it must be an object"],
    ['{"lifetime": {"epsilon": 1, "delta": 0.1}, "rounds": {"h": {"epsilon": -1, "delta": 0}}}', "epsilon = -1 is not allowed"]]) {
    const storage = memoryStorage();
    storage.setItem(LEDGER_KEY, data);
    assert.throws(() => new DeviceLedger(storage), (exc) => exc instanceof DeviceError && exc.message.includes(needle)
      && exc.message.includes("do not delete it"), data);
  }
});

test("two ledgers on one storage (two tabs) see each other's reports", () => {
  const storage = memoryStorage();
  const tabA = new DeviceLedger(storage, { lifetimeEpsilon: 3, lifetimeDelta: 1e-3 });
  tabA.record(H1, 1, 0);
  const tabB = new DeviceLedger(storage);
  tabA.record(H2, 1, 0);
  assert.throws(() => tabB.record(H2, 1, 0), /already reported/);
  assert.throws(() => tabB.record(H3, 1.5, 0), /lifetime budget/);
});

test("localStorage is the default storage", () => {
  const storage = memoryStorage();
  globalThis.localStorage = storage;
  try {
    const ledger = new DeviceLedger(undefined, { lifetimeEpsilon: 3, lifetimeDelta: 1e-3 });
    ledger.record(H1, 1, 0);
    assert.ok(storage.map.has(LEDGER_KEY));
  } finally {
    delete globalThis.localStorage;
  }
});

test("randomizeRecords charges the head list's (ε, δ) before reporting, once per head list", needsFixtures(fx),
  async () => {
    const h = fx.headlists[1];
    const doc = JSON.parse(h.text);
    const storage = memoryStorage();
    const ledger = new DeviceLedger(storage, { lifetimeEpsilon: 100, lifetimeDelta: 0.01 });
    const records = [[doc.queries[0].query, doc.queries[0].urls[0]]];
    const msg = await randomizeRecords(h.text, records, { ledger });
    assert.equal(msg.headlist, h.hash);
    assert.match(msg.id, /^[A-Za-z0-9_-]{22}$/);
    assert.equal(msg.reports.length, 1);
    assert.deepEqual(JSON.parse(storage.map.get(LEDGER_KEY)).rounds, { [h.hash]: { epsilon: doc.epsilon,
      delta: doc.delta } });
    await assert.rejects(randomizeRecords(h.text, records, { ledger }), /already reported/);
    // a device with no URL at all for a URL-level head list is refused before charging
    const other = fx.headlists[0];
    await assert.rejects(randomizeRecords(other.text, [["weather", null]], { ledger }), /url_level true/);
    assert.equal(ledger.hasReported(other.hash), false);
    // over the lifetime budget: refused, and no draws were made
    const small = new DeviceLedger(memoryStorage(), { lifetimeEpsilon: 1, lifetimeDelta: 0.01 });
    await assert.rejects(randomizeRecords(other.text, [["weather", "u"]], { ledger: small, source: replaySource([]) }),
      /lifetime budget/);
  });

test("memoization: the same head list and records in another service round re-send the same reports, uncharged",
  needsFixtures(fx), async () => {
    const h = fx.headlists[1];
    const doc = JSON.parse(h.text);
    const storage = memoryStorage();
    const ledger = new DeviceLedger(storage, { lifetimeEpsilon: 100, lifetimeDelta: 0.01 });
    const records = [[doc.queries[0].query, doc.queries[0].urls[0]]];
    assert.equal(ledger.canResend(h.hash, "round-A"), false); // nothing kept yet
    const first = await randomizeRecords(h.text, records, { ledger, roundId: "round-A" });
    const spent = ledger.spent();
    assert.equal(ledger.canResend(h.hash, "round-A"), false); // sent in that round already
    assert.equal(ledger.canResend(h.hash, "round-B"), true);
    assert.equal(ledger.canResend(h.hash, "round-B"), true); // read only: asking notes nothing
    const second = await randomizeRecords(h.text, records, { ledger, roundId: "round-B" });
    assert.deepEqual(second.reports, first.reports);
    assert.notEqual(second.id, first.id); // a fresh message id: the server counts it in its own round
    assert.deepEqual(ledger.spent(), spent); // one charge for both
    await assert.rejects(randomizeRecords(h.text, records, { ledger, roundId: "round-B" }), /already reported/);
    // other records in a later round: the same kept reports, uncharged (a refusal would tell that they changed)
    const other = [[doc.queries[1].query, doc.queries[1].urls[0]]];
    const third = await randomizeRecords(h.text, other, { ledger, roundId: "round-C" });
    assert.deepEqual(third.reports, first.reports);
    assert.deepEqual(ledger.spent(), spent);
    const memo = JSON.parse(storage.map.get(LEDGER_KEY)).memo[h.hash];
    assert.deepEqual(memo.sent_in, ["round-A", "round-B", "round-C"]);
    assert.equal(memo.records, recordsKey(records)); // the key of the records the reports were made from
    assert.match(memo.records, /^[0-9a-f]{64}$/); // the records' key, never the records (the reports are kept)
  });

test("recordsKey is SHA-256 of the sorted rows, as the Python device's records_key", async () => {
  const { createHash } = await import("node:crypto");
  const rows = ['["maps", "https://m.example/a"]', '["weather", "https://w.example/a"]', '["weather", null]'];
  const expected = createHash("sha256").update(rows.join("\n")).digest("hex");
  const { recordsKey } = await import("../hybriddp-device.js");
  assert.equal(recordsKey([["weather", "https://w.example/a"], ["maps", "https://m.example/a"], ["weather", null]]),
    expected);
  assert.equal(expected, "b05862c228e6aff6aadcd36251e5ba4949a9bd84b3133eb64b6cf0ef99c96674"); // Python's records_key
  assert.equal(recordsKey([["weather", null], ["maps", "https://m.example/a"], ["weather", "https://w.example/a"]]),
    expected); // a multiset: the order does not matter
});

test("one period in r: one slot per block, drawn once and kept; uniform (chi-square, p > 1e-6)", async () => {
  const { chiSquarePooled } = await import("./support.js");
  const r = 6;
  const counts = new Array(r).fill(0);
  for (let i = 0; i < 3000; i++) {
    const ledger = new DeviceLedger(memoryStorage(), { lifetimeEpsilon: 16, lifetimeDelta: 1e-4 });
    const answers = [...Array(2 * r).keys()].map((p) => ledger.takesPart("s", p, r));
    assert.equal(answers.slice(0, r).filter(Boolean).length, 1);
    assert.equal(answers.slice(r).filter(Boolean).length, 1);
    assert.deepEqual([...Array(2 * r).keys()].map((p) => ledger.takesPart("s", p, r)), answers); // kept
    counts[answers.indexOf(true)] += 1;
  }
  assert.ok(chiSquarePooled(counts, new Array(r).fill(1 / r)).p > 1e-6, String(counts));
  const late = new DeviceLedger(memoryStorage(), { lifetimeEpsilon: 16, lifetimeDelta: 1e-4 });
  const picks = [3, 4, 5, 6, 7, 8].map((p) => late.takesPart("s", p, r, () => 2));
  assert.deepEqual(picks, [false, false, false, false, false, true]); // first asked at period 3: slot 2 has passed
  assert.throws(() => late.takesPart("s", 1, 0), /integer >= 1/);
  assert.equal(late.takesPart("s", 5, 1), true);
});
