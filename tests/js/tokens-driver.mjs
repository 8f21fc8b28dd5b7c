// The JS device's fetchToken (clients/js/hybriddp-device.js, protocol v2) with its HTTP requests answered by pytest,
// for tests/test_js_tokens.py. Lines of JSON: stdin's first line is {base_url, round, credential, headlist, message};
// each request fetchToken makes is written to stdout as {"request": {url, method, headers, body}} and answered by
// the next stdin line {"status", "body"}; the last stdout line is {"result": {token, messageId, spent: the message
// with the token attached (attachToken)}} or {"error": {name, message, status, code}}. Randomness is the default,
// crypto.getRandomValues.
import { createInterface } from "node:readline";

import { attachToken, fetchToken } from "../../clients/js/hybriddp-device.js";

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const nextLine = async () => {
  const { value, done } = await lines.next();
  if (done) throw new Error("stdin closed");
  return JSON.parse(value);
};
const send = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`);

const job = await nextLine();
const fetchFn = async (url, init = {}) => {
  send({ request: { url, method: init.method ?? "GET", headers: init.headers ?? {}, body: init.body ?? null } });
  const answer = await nextLine();
  return new Response(JSON.stringify(answer.body), { status: answer.status,
    headers: { "content-type": "application/json" } });
};
try {
  const got = await fetchToken(fetchFn, job.base_url, job.round, job.credential, job.headlist);
  send({ result: { ...got, spent: attachToken(job.message, got) } });
} catch (exc) {
  send({ error: { name: exc.name, message: exc.message, status: exc.status ?? null, code: exc.code ?? null } });
}
process.exit(0);
