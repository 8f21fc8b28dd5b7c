// Head-list validation refuses exactly the documents the Python device refuses, naming the field.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  canonicalJson, contentHash, DeviceError, DeviceHeadList, randomizeRecords, validateHeadList,
} from "../hybriddp-device.js";
import { loadFixtures, needsFixtures } from "./support.js";

const fx = loadFixtures();

async function verdict(input) {
  try {
    await validateHeadList(input);
    return null;
  } catch (exc) {
    assert.ok(exc instanceof DeviceError, `not a DeviceError: ${exc && exc.stack}`);
    assert.equal(exc.name, "DeviceError");
    return exc.message;
  }
}

test("JSON text: every Python verdict, with Python's message word for word", needsFixtures(fx), async () => {
  let refused = 0;
  for (const v of fx.variants) {
    const message = await verdict(v.text);
    if (v.python_error === null) {
      assert.equal(message, null, `${v.name}: Python accepts it`);
    } else {
      assert.notEqual(message, null, `${v.name}: Python refuses it (${v.python_error})`);
      assert.ok(message.includes(v.field), `${v.name}: '${message}' does not name ${v.field}`);
      assert.equal(message, v.python_error, v.name);
      assert.ok(!message.includes("\n"), "one line");
      refused++;
    }
  }
  assert.ok(refused >= 50, `${refused} refusals`);
});

test("a parsed object: Python's verdict wherever ints and floats need not be told apart", needsFixtures(fx),
  async () => {
    let checked = 0;
    for (const v of fx.variants) {
      let obj;
      try {
        obj = JSON.parse(v.text);
      } catch {
        continue; // NaN / Infinity: not JSON for JSON.parse (the text form is checked above)
      }
      if (v.typing || typeof obj === "string") continue; // a string is always read as JSON text
      const message = await verdict(obj);
      assert.equal(message === null, v.python_error === null, `${v.name}: ${message} / ${v.python_error}`);
      if (message !== null) assert.ok(message.includes(v.field), `${v.name}: ${message}`);
      checked++;
    }
    assert.ok(checked >= 60, `${checked} checked`);
  });

test("validateHeadList returns the document; text comes back as a plain object", needsFixtures(fx), async () => {
  const { text } = fx.headlists[0];
  const obj = JSON.parse(text);
  assert.equal(await validateHeadList(obj), obj);
  assert.deepEqual(await validateHeadList(text), obj);
});

test("a refused head list yields no message and charges nothing", needsFixtures(fx), async () => {
  const tampered = fx.variants.find((v) => v.name === "epsilon changed, not rehashed");
  const charged = [];
  const ledger = { record: (...args) => charged.push(args) };
  await assert.rejects(randomizeRecords(tampered.text, [["a", "b"]], { ledger }),
    (exc) => exc instanceof DeviceError && exc.message.includes("content_hash"));
  await assert.rejects(DeviceHeadList.fromJSON(JSON.parse(tampered.text)), DeviceError);
  assert.deepEqual(charged, []);
});

test("text that is not JSON is refused with a DeviceError", async () => {
  for (const bad of ["", "{", "{\"format\": 'x'}", "[1,]", "\ufeff{}", "{} x", "01"]) {
    await assert.rejects(validateHeadList(bad), (exc) => exc instanceof DeviceError && /not valid JSON/.test(
      exc.message), JSON.stringify(bad));
  }
  await assert.rejects(validateHeadList(undefined), DeviceError);
  await assert.rejects(validateHeadList({ format: "hybriddp-headlist", version: 1, epsilon: 1, delta: 0.1, f_c: 1,
    m_c: 1, queries: [], content_hash: "x", extra: () => 1 }), /cannot be hashed/);
});

test("records that are not [query, url] string pairs are refused before anything is charged", needsFixtures(fx),
  async () => {
    const hl = await DeviceHeadList.fromJSON(fx.headlists[0].text);
    const charged = [];
    const ledger = { record: (...args) => charged.push(args) };
    for (const records of [[["q"]], [["q", 3]], ["q"], [[null, "u"]], [["q", "u", "x"]], "q", [["q", undefined]],
      [["q", null]]]) {
      await assert.rejects(randomizeRecords(hl, records, { ledger }), DeviceError, JSON.stringify(records));
    }
    assert.deepEqual(charged, []);
    await assert.rejects(randomizeRecords(hl, [["q", "u"]], { messageId: "short" }), /message id/);
  });

test("known answer: the pinned head-list wire format and hash (tests/headlisthelpers.py)", needsFixtures(fx), async () => {
  const ka = fx.known_answer;
  assert.equal(canonicalJson(ka.doc_text), ka.canonical);
  assert.equal(await contentHash(ka.doc_text), ka.hash);
  assert.equal(await contentHash(JSON.parse(ka.doc_text)), ka.hash);
});
