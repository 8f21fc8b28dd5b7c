// hybriddp-device.js: LocalAlg on one device, in the browser (ALGORITHM.md §5, paper Fig. 6).
//
// A dependency-free ES module, a faithful port of the Python device randomizer
// (src/hybriddp/device.py). It reads the head-list document that `hybriddp headlist` writes
// (format "hybriddp-headlist" version 1), refuses it unless its format, version, privacy
// fields, query list and content hash check out (as Python's validate_headlist does), samples
// at most m_C of the device's records and randomizes each one:
//
//   ε' = ε/m_C, δ' = δ/m_C; ε'_Q = f_C·ε', δ'_Q = f_C·δ'; ε'_U = ε' − ε'_Q, δ'_U = δ' − δ'_Q;
//   t = (e^{ε'_Q} + (δ'_Q/2)(k−1)) / (e^{ε'_Q} + k − 1), t_q likewise with ε'_U, δ'_U, k_q;
//   with probability 1 − t report a uniformly random other query and a uniform URL of it;
//   else with probability 1 − t_q keep the query and report a uniformly random other URL;
//   else report the record itself.
//
// Draws come from a source {uniform(), below(n)} in exactly the Python order, so identical
// uniforms give identical reports. The default source is crypto.getRandomValues (53-bit
// uniforms, integers by rejection sampling). Theorem 3: each message is (ε, δ)-locally DP.
//
// A report is {query, url} with null for the wildcard *; a message is
// {id, headlist: <content hash>, reports: [...]}, the body of POST /api/v1/rounds/{id}/reports.
//
// Report protocol v2 (docs/TOKENS.md, spec-v2): what each device function guarantees.
//
// * validateHeadList / DeviceHeadList.fromJSON: the document is a head list whose content hash matches its content,
//   with the optional committed fields (token_key, ohttp_key, report_window) of the right types when present; so
//   every message's `headlist` hash commits to the round's key and schedule too.
// * listsHash(doc) / DeviceHeadList#listsHash: the content hash of the document without those round commitments
//   (ROUND_COMMITMENTS; Python's lists_hash), the content hash itself when it has none. Two rounds publishing the
//   same lists share it; randomizeRecords keys the device ledger (charges and memoized reports, ALGORITHM.md §15)
//   by it, while the message's `headlist` stays the full content hash.
// * fetchToken(fetchFn, baseUrl, roundId, credential, doc): a token got BEFORE the message exists, on a request of
//   its own: the round's key is refused (nothing posted) unless SHA-256(SPKI) is the head list's token_key.key_id,
//   e = 65537 and the modulus is the committed size, at least 2048 bits (parseTokenKey, checkCommittedKey); the
//   nonce is 32 bytes from crypto.getRandomValues (newNonce), blinded (RFC 9474), so the issuer sees nothing it can
//   match to the token later. Resolves to {token: the 354-byte RFC 9578 Token, base64url; messageId}.
// * messageIdFor(nonce) / attachToken(message, token): the message takes the id derived from the token's nonce; the
//   server refuses any other id, so one token counts once whatever message carries it, and a retry (same message,
//   same token) is acknowledged and not counted again. The token is not bound to the reports.
// * reportTime(doc, now, random) / outboxEntry(..., {reportNow}): the send time is uniform in the report window
//   (before it opens: over the whole window; inside: over what is left; after: now), independent of when the token
//   was got. reportNow sends at once: for tests and simulations only; it gives up unlinkability.
// * sendReport: POSTs the kept message; 409 too_few_tokens carries retryAfter: keep the message and retry it as is.
// * checkMirror(fetchFn, mirrorUrl, roundId, contentHash): refuses unless a mirror (e.g. the relay) serves a head
//   list with the same content hash: a server showing this device its own head list (its own key) is caught.
// * ohttpFetch(relayUrl, keyConfig): a fetch stand-in sending every request through an Oblivious HTTP relay
//   (RFC 9458, HPKE RFC 9180 P-256/HKDF-SHA256/AES-128-GCM, binary HTTP RFC 9292), all in WebCrypto: the relay
//   sees the device's address and ciphertext, the server the request and the relay's address. checkOhttpKey
//   refuses a key config other than the head list's ohttp_key.
// What the browser does not allow: a page cannot ask fetch for a fresh connection (HTTP connections are pooled and
// may carry the token request and the report alike); requests go with no cookies, no cache and no referrer, and
// the relay, not the connection, is what separates them. WebCrypto cannot erase keys (a CryptoKey is dropped, not
// zeroed), and the RSA blinding is BigInt arithmetic, not constant time (it handles only the device's own blinding
// factor). crypto.subtle exists only in secure contexts (https or localhost): tokens and OHTTP need one.

export const HEADLIST_FORMAT = "hybriddp-headlist";
export const HEADLIST_VERSION = 1;
/** ln(largest double) ≈ 709.78: LocalAlg's ε'_Q and ε'_U must not exceed it. */
export const LN_FLOAT_MAX = Math.log(Number.MAX_VALUE);
/** The largest m_C a head list may carry (a 64-bit integer), as a BigInt. */
export const M_C_MAX = 2n ** 63n - 1n;
/**
 * The fields a service-published head list adds for its round (docs/TOKENS.md "One key per round"): inside the
 * content hash, outside the lists hash (listsHash). As Python's ROUND_COMMITMENTS.
 */
export const ROUND_COMMITMENTS = Object.freeze(["token_key", "ohttp_key", "report_window"]);
/** The storage key of the device ledger. */
export const LEDGER_KEY = "hybriddp-device-ledger";
const MESSAGE_ID_BYTES = 16;

/** The head list or the records given to the device randomizer are unusable. */
export class DeviceError extends Error {
  constructor(message) {
    super(message);
    this.name = "DeviceError";
  }
}

// ----- randomness -------------------------------------------------------------------------------

function cryptoObject() {
  const c = globalThis.crypto;
  if (!c || typeof c.getRandomValues !== "function") {
    throw new DeviceError("no crypto.getRandomValues in this environment: the device randomizer needs the "
      + "platform's cryptographic random numbers (any current browser, or Node 19+)");
  }
  return c;
}

/**
 * OS randomness (crypto.getRandomValues): the default, and the only choice for production.
 * uniform() has 53 random bits (as Python's random()); below(n) is exact by rejection sampling;
 * bytes(n) is n random bytes.
 *
 * options.getRandomValues: for tests and reproducible experiments only — a function that fills a
 * typed array with random bytes in place (as crypto.getRandomValues) and replaces the OS as the
 * byte stream; the conversion to uniforms and integers is the same code. Left out (the default),
 * it is crypto.getRandomValues.
 */
export function systemSource(options = {}) {
  const getRandomValues = options?.getRandomValues;
  let fill;
  if (getRandomValues === undefined) {
    const c = cryptoObject();
    fill = (array) => c.getRandomValues(array);
  } else if (typeof getRandomValues === "function") {
    fill = getRandomValues;
  } else {
    throw new DeviceError(`systemSource: getRandomValues must be a function that fills a typed array with random `
      + `bytes, not ${typeof getRandomValues}; leave it out for the OS source (crypto.getRandomValues)`);
  }
  const pool = new Uint32Array(1024);
  let pos = pool.length;
  const next32 = () => {
    if (pos === pool.length) {
      fill(pool);
      pos = 0;
    }
    return pool[pos++];
  };
  return {
    uniform() {
      const a = next32() >>> 5; // 27 bits
      const b = next32() >>> 6; // 26 bits
      return (a * 67108864 + b) / 9007199254740992;
    },
    below(n) {
      if (!Number.isSafeInteger(n) || n < 1) {
        throw new DeviceError(`below(n): n = ${n} must be a positive safe integer`);
      }
      if (n === 1) return 0;
      const bits = (n - 1).toString(2).length; // the bits of the largest value, n − 1
      for (;;) { // draw a bits-bit integer, reject it if ≥ n (no modulo bias; < 2 draws on average)
        let r;
        if (bits <= 32) {
          r = bits === 32 ? next32() : next32() & (2 ** bits - 1);
        } else {
          r = (next32() & (2 ** (bits - 32) - 1)) * 4294967296 + next32();
        }
        if (r < n) return r;
      }
    },
    bytes(n) {
      const out = new Uint8Array(n);
      for (let i = 0; i < n; i += 65536) fill(out.subarray(i, i + 65536)); // crypto's limit per call
      return out;
    },
  };
}

/** Replays given uniforms (as Python UniformReplay): uniform() = next value, below(n) = ⌊v·n⌋. */
export function replaySource(uniforms) {
  const it = uniforms[Symbol.iterator]();
  const next = () => {
    const r = it.next();
    if (r.done) throw new DeviceError("replaySource: the given uniforms are used up");
    return r.value;
  };
  return {
    uniform: () => next(),
    below: (n) => Math.floor(next() * n),
  };
}

// ----- Fig. 6 lines 1-5 -------------------------------------------------------------------------

/** [ε'_Q, δ'_Q, ε'_U, δ'_U] of Fig. 6 lines 1-3 (ALGORITHM.md §5). */
export function budgetSplit(epsilon, delta, fC, mC) {
  const eps1 = epsilon / mC;
  const delta1 = delta / mC;
  const epsQ = fC * eps1;
  const deltaQ = fC * delta1;
  return [epsQ, deltaQ, eps1 - epsQ, delta1 - deltaQ];
}

/** t = (e^ε + (δ/2)(n−1)) / (e^ε + n − 1), the chance to keep the true one of n values; n ≤ 1 gives 1. */
export function keepProbability(eps, delta, n) {
  if (n <= 1) return 1.0;
  const e = Math.exp(eps);
  return (e + (delta / 2.0) * (n - 1)) / (e + n - 1);
}

/** [t, [t_q for each query position]] of Fig. 6 lines 4-5 (ALGORITHM.md §5). */
export function thresholds(k, kq, epsilon, delta, fC, mC) {
  const [epsQ, deltaQ, epsU, deltaU] = budgetSplit(epsilon, delta, fC, mC);
  return [keepProbability(epsQ, deltaQ, k), kq.map((n) => keepProbability(epsU, deltaU, n))];
}

function nextTowardZero(x) {
  const buf = new DataView(new ArrayBuffer(8));
  buf.setFloat64(0, x);
  buf.setBigUint64(0, buf.getBigUint64(0) - 1n);
  return buf.getFloat64(0);
}

/** The largest ε for which e^{ε'_Q} and e^{ε'_U} are finite doubles (Python max_epsilon). */
export function maxEpsilon(fC, mC) {
  const works = (eps) => {
    const [epsQ, , epsU] = budgetSplit(eps, 0.0, fC, mC);
    return Number.isFinite(Math.exp(epsQ)) && Number.isFinite(Math.exp(epsU));
  };
  let eps = (mC * LN_FLOAT_MAX) / Math.max(fC, 1.0 - fC);
  while (eps > 0 && !works(eps)) eps = nextTowardZero(eps);
  return eps;
}

// ----- message ids ------------------------------------------------------------------------------

const B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

function base64url(bytes) {
  let out = "";
  for (let i = 0; i < bytes.length; i += 3) {
    const n = (bytes[i] << 16) | ((bytes[i + 1] ?? 0) << 8) | (bytes[i + 2] ?? 0);
    const chars = B64URL[(n >> 18) & 63] + B64URL[(n >> 12) & 63] + B64URL[(n >> 6) & 63] + B64URL[n & 63];
    out += chars.slice(0, Math.min(4, Math.ceil(((bytes.length - i) * 8) / 6)));
  }
  return out;
}

/**
 * A random message id: 16 random bytes in URL-safe base64 without padding (22 characters).
 * source: where the bytes come from, source.bytes(16); the default, systemSource(), is the OS.
 * Another source (e.g. systemSource({getRandomValues})) is for tests and reproducible experiments only.
 */
export function newMessageId(source = undefined) {
  const src = source && typeof source.bytes === "function" ? source : systemSource();
  return base64url(src.bytes(MESSAGE_ID_BYTES));
}

/** value if it is 16 bytes in URL-safe base64 (22 characters, no padding), else DeviceError. */
export function checkMessageId(value) {
  if (typeof value !== "string" || !/^[A-Za-z0-9_-]{22}$/.test(value)) {
    throw new DeviceError(`message id ${show(fromJs(value), 40)} is not valid: it must be 16 random bytes in `
      + "URL-safe base64 without padding (22 characters of A-Z a-z 0-9 - _), e.g. from newMessageId()");
  }
  return value;
}

// ----- Python's view of a JSON document ---------------------------------------------------------
// Validation and hashing work on a "Python tree": null, booleans, strings, BigInt (Python int),
// Number (Python float), Array (list), Map (dict). Parsing the text keeps ints and floats apart
// exactly; a parsed JS object is read as hybriddp writes it (epsilon, delta, f_c are floats,
// every other integral number is an int).

const FLOAT_FIELDS = new Set(["epsilon", "delta", "f_c"]);

class NotJson {
  constructor(what) {
    this.what = what;
  }
}

function fromJs(value, topKey = null) {
  if (value === null || typeof value === "boolean" || typeof value === "string" || typeof value === "bigint") {
    return value;
  }
  if (typeof value === "number") {
    if (FLOAT_FIELDS.has(topKey) || !Number.isInteger(value)) return value;
    return BigInt(value);
  }
  if (Array.isArray(value)) return value.map((v) => fromJs(v));
  if (typeof value === "object" && Object.prototype.toString.call(value) === "[object Object]") {
    const m = new Map();
    for (const k of Object.keys(value)) m.set(k, fromJs(value[k]));
    return m;
  }
  return new NotJson(typeof value);
}

function fromJsTop(doc) {
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)
      || Object.prototype.toString.call(doc) !== "[object Object]") {
    return fromJs(doc);
  }
  const m = new Map();
  for (const k of Object.keys(doc)) m.set(k, fromJs(doc[k], k));
  return m;
}

function toJs(value) {
  if (typeof value === "bigint") return Number(value);
  if (Array.isArray(value)) return value.map(toJs);
  if (value instanceof Map) {
    const o = {};
    for (const [k, v] of value) Object.defineProperty(o, k, { value: toJs(v), writable: true, enumerable: true,
      configurable: true });
    return o;
  }
  return value;
}

/** Parse JSON text as Python's json.loads does (ints as BigInt, floats as Number, NaN/Infinity allowed). */
function parsePython(text) {
  let i = 0;
  const fail = (what) => {
    throw new SyntaxError(`${what} at character ${i}`);
  };
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const numberRe = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;
  const value = () => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const m = new Map();
      ws();
      if (text[i] === "}") {
        i++;
        return m;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail("expected a property name in double quotes");
        const k = string();
        ws();
        if (text[i] !== ":") fail("expected ':'");
        i++;
        m.set(k, value());
        ws();
        if (text[i] === ",") i++;
        else if (text[i] === "}") {
          i++;
          return m;
        } else fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      i++;
      const a = [];
      ws();
      if (text[i] === "]") {
        i++;
        return a;
      }
      for (;;) {
        a.push(value());
        ws();
        if (text[i] === ",") i++;
        else if (text[i] === "]") {
          i++;
          return a;
        } else fail("expected ',' or ']'");
      }
    }
    if (c === '"') return string();
    for (const [word, v] of [["null", null], ["true", true], ["false", false], ["NaN", NaN],
      ["Infinity", Infinity], ["-Infinity", -Infinity]]) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return v;
      }
    }
    numberRe.lastIndex = i;
    const m = numberRe.exec(text);
    if (!m) fail("expected a value");
    i += m[0].length;
    return m[1] !== undefined || m[2] !== undefined ? Number(m[0]) : BigInt(m[0]);
  };
  const ESC = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };
  const string = () => {
    i++; // opening quote
    let out = "";
    for (;;) {
      if (i >= text.length) fail("unterminated string");
      const c = text[i];
      if (c === '"') {
        i++;
        return out;
      }
      if (c < " ") fail("invalid control character in a string");
      if (c === "\\") {
        const e = text[i + 1];
        if (e === "u") {
          const hex = text.slice(i + 2, i + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail("invalid \\uXXXX escape");
          out += String.fromCharCode(parseInt(hex, 16));
          i += 6;
        } else if (e !== undefined && Object.hasOwn(ESC, e)) {
          out += ESC[e];
          i += 2;
        } else fail("invalid escape");
      } else {
        out += c;
        i++;
      }
    }
  };
  if (text.startsWith("\ufeff")) fail("unexpected byte order mark");
  const v = value();
  ws();
  if (i !== text.length) fail("extra data");
  return v;
}

/** Python repr(float): shortest round-trip digits, exponent form below 1e-4 and from 1e16. */
export function pyFloatRepr(x) {
  if (Number.isNaN(x)) return "NaN";
  if (x === Infinity) return "Infinity";
  if (x === -Infinity) return "-Infinity";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  const [mant, e = "0"] = Math.abs(x).toString().split("e");
  const [ip, fp = ""] = mant.split(".");
  let digits = ip + fp;
  let exp = parseInt(e, 10) + ip.length - 1;
  while (digits[0] === "0") {
    digits = digits.slice(1);
    exp--;
  }
  digits = digits.replace(/0+$/, "");
  if (exp < -4 || exp >= 16) {
    const d = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    return `${sign}${d}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  }
  if (exp < 0) return `${sign}0.${"0".repeat(-exp - 1)}${digits}`;
  if (digits.length <= exp + 1) return `${sign}${digits}${"0".repeat(exp + 1 - digits.length)}.0`;
  return `${sign}${digits.slice(0, exp + 1)}.${digits.slice(exp + 1)}`;
}

function pyString(s) {
  let out = '"';
  for (const ch of s) {
    const c = ch.charCodeAt(0);
    if (ch === '"') out += '\\"';
    else if (ch === "\\") out += "\\\\";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (ch === "\b") out += "\\b";
    else if (ch === "\f") out += "\\f";
    else if (c < 0x20) out += `\\u${c.toString(16).padStart(4, "0")}`;
    else out += ch;
  }
  return `${out}"`;
}

function compareCodePoints(a, b) {
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) {
    const x = a.codePointAt(i);
    const y = b.codePointAt(j);
    if (x !== y) return x < y ? -1 : 1;
    i += x > 0xffff ? 2 : 1;
    j += y > 0xffff ? 2 : 1;
  }
  return (a.length - i > 0 ? 1 : 0) - (b.length - j > 0 ? 1 : 0);
}

function canon(v) {
  if (v === null) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "number") return pyFloatRepr(v);
  if (typeof v === "string") return pyString(v);
  if (Array.isArray(v)) return `[${v.map(canon).join(",")}]`;
  if (v instanceof Map) {
    const keys = [...v.keys()].sort(compareCodePoints);
    return `{${keys.map((k) => `${pyString(k)}:${canon(v.get(k))}`).join(",")}}`;
  }
  throw new DeviceError(`Object of type ${v instanceof NotJson ? v.what : typeof v} is not JSON serializable`);
}

/**
 * The text the content hash covers: Python's json.dumps(body, sort_keys=True, separators=(",", ":"),
 * ensure_ascii=False) of the document without its content_hash (an object is read as hybriddp writes
 * it; JSON text is read exactly as Python reads it).
 */
export function canonicalJson(docOrText) {
  const tree = typeof docOrText === "string" ? parsePython(docOrText) : fromJsTop(docOrText);
  return canon(tree instanceof Map ? withoutHash(tree) : tree);
}

const withoutHash = (tree) => new Map([...tree].filter(([k]) => k !== "content_hash"));

/** UTF-8 with Python's "surrogatepass": a lone surrogate becomes its 3-byte encoding. */
function utf8(s) {
  const out = [];
  for (let i = 0; i < s.length; i++) {
    let c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
        i++;
      }
    }
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return Uint8Array.from(out);
}

const K256 = Uint32Array.from([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

/** SHA-256 in plain JS: used where crypto.subtle is missing (a page on plain http, not localhost). */
export function sha256Hex(bytes) {
  const len = bytes.length;
  const padded = new Uint8Array(((len + 9 + 63) >> 6) << 6);
  padded.set(bytes);
  padded[len] = 0x80;
  const view = new DataView(padded.buffer);
  view.setUint32(padded.length - 8, Math.floor(len / 0x20000000));
  view.setUint32(padded.length - 4, (len * 8) >>> 0);
  const h = Uint32Array.from([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c,
    0x1f83d9ab, 0x5be0cd19]);
  const w = new Uint32Array(64);
  const rotr = (x, n) => (x >>> n) | (x << (32 - n));
  for (let off = 0; off < padded.length; off += 64) {
    for (let t = 0; t < 16; t++) w[t] = view.getUint32(off + 4 * t);
    for (let t = 16; t < 64; t++) {
      const s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >>> 3);
      const s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >>> 10);
      w[t] = (w[t - 16] + s0 + w[t - 7] + s1) >>> 0;
    }
    let [a, b, c, d, e, f, g, hh] = h;
    for (let t = 0; t < 64; t++) {
      const t1 = (hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K256[t] + w[t]) >>> 0;
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) >>> 0;
      hh = g;
      g = f;
      f = e;
      e = (d + t1) >>> 0;
      d = c;
      c = b;
      b = a;
      a = (t1 + t2) >>> 0;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
  return [...h].map((x) => x.toString(16).padStart(8, "0")).join("");
}

async function sha256Of(bytes) {
  const subtle = globalThis.crypto && globalThis.crypto.subtle;
  if (subtle && typeof subtle.digest === "function") {
    const digest = new Uint8Array(await subtle.digest("SHA-256", bytes));
    return [...digest].map((x) => x.toString(16).padStart(2, "0")).join("");
  }
  return sha256Hex(bytes);
}

async function hashTree(tree) {
  return `sha256:${await sha256Of(utf8(canon(withoutHash(tree))))}`;
}

/** "sha256:<hex>" of the canonical JSON of the document without its content_hash (Python content_hash). */
export async function contentHash(docOrText) {
  const tree = typeof docOrText === "string" ? parsePython(docOrText) : fromJsTop(docOrText);
  if (!(tree instanceof Map)) throw new DeviceError("contentHash: the document is not a JSON object");
  return hashTree(tree);
}

async function listsHashOfTree(tree) {
  if (!ROUND_COMMITMENTS.some((k) => tree.has(k))) {
    if (!tree.has("content_hash")) throw new DeviceError("listsHash: the document has no content_hash");
    return String(tree.get("content_hash"));
  }
  return hashTree(new Map([...tree].filter(([k]) => !ROUND_COMMITMENTS.includes(k))));
}

/**
 * The content hash of what a device randomizes over: the document without its round's commitments
 * (ROUND_COMMITMENTS), or its declared content_hash when it has none (Python lists_hash). Two rounds that publish
 * the same lists have the same lists hash and different content hashes; the device ledger is keyed by it
 * (ALGORITHM.md §15).
 */
export async function listsHash(docOrText) {
  const tree = typeof docOrText === "string" ? parsePython(docOrText) : fromJsTop(docOrText);
  if (!(tree instanceof Map)) throw new DeviceError("listsHash: the document is not a JSON object");
  return listsHashOfTree(tree);
}

// ----- validation (Python validate_headlist) ----------------------------------------------------

const REBUILD = "Use the head list exactly as `hybriddp headlist` wrote it, or rebuild it.";

function pyRepr(v) {
  if (v === null) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "number") {
    if (Number.isNaN(v)) return "nan";
    if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
    return pyFloatRepr(v);
  }
  if (typeof v === "string") {
    const q = v.includes("'") && !v.includes('"') ? '"' : "'";
    const body = v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/\r/g, "\\r").replace(/\t/g, "\\t")
      .replace(q === "'" ? /'/g : /"/g, `\\${q}`)
      .replace(/[\x00-\x1f\x7f-\x9f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`)
      .replace(new RegExp(`${LONE_SURROGATE.source}|[\u2028\u2029]`, "g"),
        (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
    return q + body + q;
  }
  if (Array.isArray(v)) return `[${v.map(pyRepr).join(", ")}]`;
  if (v instanceof Map) return `{${[...v].map(([k, x]) => `${pyRepr(k)}: ${pyRepr(x)}`).join(", ")}}`;
  if (v instanceof NotJson) return `<${v.what}>`;
  return String(v);
}

function show(value, limit = 60) {
  let text;
  try {
    text = pyRepr(value);
  } catch {
    text = "<nested too deeply>";
  }
  return text.length <= limit ? text : `${text.slice(0, limit - 3)}...`;
}

function kind(v) {
  if (v === null) return "null";
  if (typeof v === "boolean") return "a boolean";
  if (typeof v === "string") return "a string";
  if (typeof v === "number" || typeof v === "bigint") return "a number";
  if (Array.isArray(v)) return "a list";
  if (v instanceof Map) return "an object";
  return `a ${v instanceof NotJson ? v.what : typeof v}`;
}

const asFloat = (v) => (typeof v === "bigint" ? Number(v) : v); // Number(huge BigInt) is ±Infinity, as Python

function checkNumber(where, value, allowed, ok, fix, integer = false) {
  const isNum = integer ? typeof value === "bigint" : typeof value === "bigint" || typeof value === "number";
  if (!isNum) {
    let what;
    if (integer && typeof value === "number") what = "not an integer";
    else if (typeof value === "string") what = "a string, not a number (numbers are written without quotes)";
    else what = `${kind(value)}, not a number`;
    throw new DeviceError(`${where} = ${show(value)} is ${what}; it must be ${allowed}. ${fix}`.trimEnd());
  }
  // an integer is compared exactly (2**63 − 1 as a float is 2**63); a number as a float (NaN fails every comparison)
  if (!ok(integer ? value : asFloat(value))) {
    throw new DeviceError(`${where} = ${show(value)} is not allowed: it must be ${allowed}. ${fix}`.trimEnd());
  }
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

function checkText(where, value, fix) {
  if (typeof value !== "string") {
    throw new DeviceError(`${where} = ${show(value)} is ${kind(value)}; it must be a string. ${fix}`);
  }
  if (LONE_SURROGATE.test(value)) {
    throw new DeviceError(`${where} = ${show(value)} holds a lone surrogate, which is not text. ${fix}`);
  }
  return value;
}

function checkQueries(queries, source) {
  const shape = 'a list of objects {"query": "...", "urls": ["...", ...]}';
  if (!Array.isArray(queries)) {
    throw new DeviceError(`${source}: field 'queries' = ${show(queries)} is ${kind(queries)}; it must be ${shape}. `
      + REBUILD);
  }
  const seen = new Map();
  queries.forEach((item, i) => {
    const where = `${source}: queries[${i}]`;
    if (!(item instanceof Map)) {
      throw new DeviceError(`${where} = ${show(item)} is ${kind(item)}; it must be an object `
        + `{"query": "...", "urls": ["...", ...]}. ${REBUILD}`);
    }
    for (const key of ["query", "urls"]) {
      if (!item.has(key)) {
        throw new DeviceError(`${where} has no field '${key}'; each entry is `
          + `{"query": "...", "urls": ["...", ...]}. ${REBUILD}`);
      }
    }
    const q = checkText(`${where}.query`, item.get("query"), REBUILD);
    if (seen.has(q)) {
      throw new DeviceError(`${source}: query ${show(q)} is listed twice (queries[${seen.get(q)}] and `
        + `queries[${i}]); a head list lists each query once. ${REBUILD}`);
    }
    seen.set(q, i);
    const urls = item.get("urls");
    if (!Array.isArray(urls)) {
      throw new DeviceError(`${where}.urls = ${show(urls)} is ${kind(urls)}; it must be a list of strings `
        + `(empty when the query has no listed URL). ${REBUILD}`);
    }
    const urlSeen = new Map();
    urls.forEach((u, j) => {
      checkText(`${where}.urls[${j}]`, u, REBUILD);
      if (urlSeen.has(u)) {
        throw new DeviceError(`${source}: URL ${show(u)} is listed twice under query ${show(q)} `
          + `(queries[${i}].urls[${urlSeen.get(u)}] and [${j}]). ${REBUILD}`);
      }
      urlSeen.set(u, j);
    });
  });
}

/**
 * The optional fields a service-published head list commits to (spec v2 §1), checked for their types when present
 * (Python validate_headlist): token_key {key_id: 32 bytes b64url, modulus_bits: int >= 2048, e: 65537}, ohttp_key
 * (b64url), report_window {opens, closes: "YYYY-MM-DDTHH:MM:SSZ", opens <= closes}.
 */
function checkCommitments(doc, source) {
  const fix = "The server publishes these fields; use its head list as served.";
  if (doc.has("token_key")) {
    const tk = doc.get("token_key");
    if (!(tk instanceof Map)) {
      throw new DeviceError(`${source}: field 'token_key' = ${show(tk)} is ${kind(tk)}; it must be an object `
        + `{"key_id", "modulus_bits", "e"}. ${fix}`);
    }
    const keyId = tk.get("key_id");
    if (typeof keyId !== "string" || !/^[A-Za-z0-9_-]{43}=?$/.test(keyId)) {
      throw new DeviceError(`${source}: field 'token_key.key_id' = ${show(keyId ?? null)} must be 32 bytes in `
        + `URL-safe base64. ${fix}`);
    }
    fromBase64url(keyId, "token_key.key_id", 32);
    checkNumber(`${source}: field 'token_key.modulus_bits'`, tk.has("modulus_bits") ? tk.get("modulus_bits") : null,
      `an integer >= ${TOKEN_KEY_BITS}`, (x) => x >= BigInt(TOKEN_KEY_BITS), fix, true);
    checkNumber(`${source}: field 'token_key.e'`, tk.has("e") ? tk.get("e") : null, `${PUBLIC_EXPONENT}`,
      (x) => x === BigInt(PUBLIC_EXPONENT), fix, true);
  }
  if (doc.has("ohttp_key")) {
    const ok = doc.get("ohttp_key");
    if (typeof ok !== "string" || !ok || !/^[A-Za-z0-9_-]+={0,2}$/.test(ok)) {
      throw new DeviceError(`${source}: field 'ohttp_key' = ${show(ok)} must be a KeyConfig in URL-safe base64. ${fix}`);
    }
    fromBase64url(ok, "ohttp_key");
  }
  if (doc.has("report_window")) {
    const win = doc.get("report_window");
    if (!(win instanceof Map)) {
      throw new DeviceError(`${source}: field 'report_window' = ${show(win)} is ${kind(win)}; it must be an object `
        + `{"opens": time, "closes": time}. ${fix}`);
    }
    const opens = parseTime(win.get("opens"), "report_window.opens");
    const closes = parseTime(win.get("closes"), "report_window.closes");
    if (closes < opens) {
      throw new DeviceError(`${source}: field 'report_window': closes (${win.get("closes")}) is before opens `
        + `(${win.get("opens")}). ${fix}`);
    }
  }
}

async function validateTree(doc, source) {
  if (!(doc instanceof Map)) {
    throw new DeviceError(`${source}: expected a JSON object (a head list written by \`hybriddp headlist\`), `
      + `found ${kind(doc)}`);
  }
  const format = doc.has("format") ? doc.get("format") : null;
  if (format !== HEADLIST_FORMAT) {
    throw new DeviceError(`${source}: field 'format' = ${show(format)}, expected '${HEADLIST_FORMAT}': this is `
      + "not a head list written by `hybriddp headlist`");
  }
  const version = doc.has("version") ? doc.get("version") : null;
  if (typeof version !== "bigint" || version !== BigInt(HEADLIST_VERSION)) {
    throw new DeviceError(`${source}: field 'version' = ${show(version)}; this reader understands version `
      + `${HEADLIST_VERSION}. Upgrade hybriddp or rebuild the head list.`);
  }
  for (const key of ["epsilon", "delta", "f_c", "m_c", "queries", "content_hash"]) {
    if (!doc.has(key)) throw new DeviceError(`${source}: missing field '${key}'. ${REBUILD}`);
  }
  checkNumber(`${source}: field 'epsilon'`, doc.get("epsilon"), "a number > 0", (x) => x > 0, REBUILD);
  checkNumber(`${source}: field 'delta'`, doc.get("delta"), "a number in (0, 1)", (x) => x > 0 && x < 1, REBUILD);
  checkNumber(`${source}: field 'f_c'`, doc.get("f_c"), "a number in (0, 1]", (x) => x > 0 && x <= 1, REBUILD);
  checkNumber(`${source}: field 'm_c'`, doc.get("m_c"), `an integer from 1 to ${M_C_MAX}`,
    (x) => x >= 1 && x <= M_C_MAX, REBUILD, true); // float vs BigInt compares exactly, as in Python
  if (doc.has("url_level") && typeof doc.get("url_level") !== "boolean") {
    const v = doc.get("url_level");
    throw new DeviceError(`${source}: field 'url_level' = ${show(v)} is ${kind(v)}; it must be true or false. `
      + REBUILD);
  }
  checkQueries(doc.get("queries"), source);
  checkCommitments(doc, source);
  const declared = doc.get("content_hash");
  let actual;
  try {
    actual = await hashTree(doc);
  } catch (exc) {
    if (!(exc instanceof DeviceError || exc instanceof RangeError)) throw exc;
    throw new DeviceError(`${source}: the document cannot be hashed (${exc.message}). ${REBUILD}`);
  }
  if (declared !== actual) {
    throw new DeviceError(`${source}: field 'content_hash' = ${show(declared)} does not match the content `
      + `(${actual.slice(0, 19)}…): the file was altered or damaged after it was written. Use the original file, `
      + "or rebuild the head list.");
  }
  const fC = asFloat(doc.get("f_c"));
  const mC = asFloat(doc.get("m_c"));
  const limit = maxEpsilon(fC, mC);
  if (!(asFloat(doc.get("epsilon")) <= limit)) {
    throw new DeviceError(`${source}: field 'epsilon' = ${show(doc.get("epsilon"))} is too large: LocalAlg `
      + "computes e^(f_C·ε/m_C) and e^((1−f_C)·ε/m_C), which overflow a float when the exponent passes "
      + `ln(largest float) = ${LN_FLOAT_MAX.toFixed(2)}; with f_c = ${show(doc.get("f_c"))} and m_c = `
      + `${doc.get("m_c")} epsilon must be at most ${pyFloatRepr(limit)}. Rebuild the head list with a smaller `
      + "--epsilon (beyond about 50 per report LocalAlg reports the true record anyway).");
  }
}

function readTree(docOrText, source) {
  if (typeof docOrText !== "string") return fromJsTop(docOrText);
  try {
    return parsePython(docOrText);
  } catch (exc) {
    if (!(exc instanceof SyntaxError || exc instanceof RangeError)) throw exc;
    throw new DeviceError(`${source}: not valid JSON (${exc.message}). ${REBUILD}`);
  }
}

/**
 * Check a head-list document (a parsed object, or its JSON text: text is read exactly as Python
 * reads it); resolve to the document as a plain object, or reject with DeviceError naming the
 * field, its value and the fix. Same checks as Python validate_headlist.
 */
export async function validateHeadList(docOrText, source = "head list") {
  const tree = readTree(docOrText, source);
  await validateTree(tree, source);
  return typeof docOrText === "string" ? toJs(tree) : docOrText;
}

// ----- the head list as a device sees it --------------------------------------------------------

/**
 * A validated head list, indexed for LocalAlg. Query positions 0..k−2 are the listed queries and
 * k−1 is *; URL positions of query i are 0..k_q−2 for its listed URLs and k_q−1 for *.
 * Build it with `await DeviceHeadList.fromJSON(docOrText)`.
 */
export class DeviceHeadList {
  constructor(doc, tree, token, listsHashValue) {
    if (token !== BUILD_TOKEN) throw new DeviceError("use `await DeviceHeadList.fromJSON(doc)`: it validates");
    this.doc = doc;
    const queries = doc.queries;
    this.queryIndex = new Map(queries.map((q, i) => [q.query, i]));
    this.urlIndex = queries.map((q) => new Map(q.urls.map((u, j) => [u, j]))).concat([new Map()]);
    this.kq = queries.map((q) => q.urls.length + 1).concat([1]);
    this.epsilon = asFloat(tree.get("epsilon"));
    this.delta = asFloat(tree.get("delta"));
    this.fC = asFloat(tree.get("f_c"));
    this.mC = asFloat(tree.get("m_c"));
    this.urlLevel = tree.has("url_level") ? tree.get("url_level") : true;
    this.contentHash = tree.get("content_hash");
    /** The ledger's key: the content hash without the round's commitments (listsHash). */
    this.listsHash = listsHashValue;
    const [t, tq] = thresholds(this.kq.length, this.kq, this.epsilon, this.delta, this.fC, this.mC);
    this.t = t;
    this.tq = tq;
    this.oneMinusT = 1.0 - t;
    this.oneMinusTq = tq.map((x) => 1.0 - x);
    Object.freeze(this);
  }

  /** Validate and index a head-list document (object or JSON text). */
  static async fromJSON(docOrText, source = "head list") {
    const tree = readTree(docOrText, source);
    await validateTree(tree, source);
    return new DeviceHeadList(typeof docOrText === "string" ? toJs(tree) : docOrText, tree, BUILD_TOKEN,
      await listsHashOfTree(tree));
  }

  get k() {
    return this.kq.length;
  }

  /** Map a record onto HL: q ∉ HL → ⟨*,*⟩, u ∉ HL[q] → ⟨q,*⟩ (Fig. 6 line 6). */
  encode(query, url) {
    const qi = this.queryIndex.has(query) ? this.queryIndex.get(query) : this.k - 1;
    const idx = this.urlIndex[qi];
    const ui = url !== null && idx.has(url) ? idx.get(url) : this.kq[qi] - 1;
    return [qi, ui];
  }

  /** A report in the wire form (null = wildcard). */
  decode(qi, ui) {
    if (qi === this.k - 1) return { query: null, url: null };
    const q = this.doc.queries[qi];
    return { query: q.query, url: ui < q.urls.length ? q.urls[ui] : null };
  }
}

const BUILD_TOKEN = Symbol("DeviceHeadList.fromJSON");

/**
 * Randomize one mapped record [query position, URL position]; Fig. 6 lines 7-14. Draws at most
 * three values, always in this order: v1 (query stage), then either the other query and its URL,
 * or v2 (URL stage) and the other URL.
 */
export function localAlg(qi, ui, hl, source) {
  const k = hl.k;
  if (k === 1) return [0, 0]; // only ⟨*,*⟩ exists
  if (source.uniform() < hl.oneMinusT) { // report another query, uniform over HL \ {q}
    const j = source.below(k - 1);
    const q2 = j < qi ? j : j + 1;
    return [q2, source.below(hl.kq[q2])];
  }
  const kq = hl.kq[qi];
  if (kq > 1 && source.uniform() < hl.oneMinusTq[qi]) { // another URL, uniform over HL[q] \ {u}
    const j = source.below(kq - 1);
    return [qi, j < ui ? j : j + 1];
  }
  return [qi, ui];
}

/**
 * Refuse records LocalAlg cannot use: not [query, url] pairs of strings (url null when there is
 * none), or, for a URL-level head list, a device none of whose records has a URL.
 */
export function checkRecords(hl, records) {
  if (!Array.isArray(records)) {
    throw new DeviceError(`records = ${show(fromJs(records))} is not a list; give the device's records as `
      + "[[query, clickedUrl], ...]");
  }
  records.forEach((rec, i) => {
    if (!(Array.isArray(rec) && rec.length === 2 && typeof rec[0] === "string"
        && (rec[1] === null || typeof rec[1] === "string"))) {
      throw new DeviceError(`record ${i} = ${show(fromJs(rec))} is not a [query, url] pair of strings; give each `
        + "record as [query, clickedUrl], with url null when the record has none");
    }
  });
  if (records.length && hl.urlLevel && records.every((r) => r[1] === null)) {
    throw new DeviceError(`this device's ${records.length} record(s) have no URL (they are [query, null]), but the `
      + `head list ${hl.contentHash.slice(0, 19)}… is URL-level (url_level true): every record would be reported `
      + "as ⟨q,*⟩, a click on an unlisted URL, which biases the estimate of every listed URL. Give the device its "
      + "[query, clickedUrl] records, or use a head list built from a log without URLs (url_level false).");
  }
}

/**
 * One device's message: sample ≤ m_C records without replacement, randomize each.
 * headList: the head-list document (object or JSON text) or a DeviceHeadList; records: [[query, url|null], ...];
 * options.source: randomness (default systemSource()); options.ledger: a DeviceLedger, charged (ε, δ) for this
 * head list (keyed by its lists hash) before anything is reported; options.messageId: default a fresh random one.
 * Resolves to {id, headlist: content hash, reports: [{query, url}, ...]}.
 */
export async function randomizeRecords(headList, records, { source, ledger, messageId, roundId } = {}) {
  const hl = headList instanceof DeviceHeadList ? headList : await DeviceHeadList.fromJSON(headList);
  const id = messageId !== undefined && messageId !== null ? checkMessageId(messageId) : newMessageId();
  const src = source ?? systemSource();
  checkRecords(hl, records);
  const recs = [...records];
  // memoization (ALGORITHM.md §15): the same head list in another service round → the same reports, whatever the
  // records now (a choice that depended on them would tell whether they changed); the ledger's key is the lists
  // hash: the same lists under another round's key and window are the same head list
  const key = ledger && roundId !== undefined && roundId !== null ? recordsKey(recs) : null;
  if (key !== null) {
    const again = ledger.memoized(hl.listsHash, String(roundId));
    if (again !== null) return { id, headlist: hl.contentHash, reports: again };
  }
  if (ledger) ledger.check(hl.listsHash, hl.epsilon, hl.delta); // refused before any randomness is drawn
  const m = Math.min(hl.mC, recs.length);
  const pool = recs.map((_, i) => i);
  const chosen = [];
  for (let n = 0; n < m; n++) chosen.push(pool.splice(src.below(pool.length), 1)[0]); // without replacement
  const reports = chosen.map((i) => hl.decode(...localAlg(...hl.encode(recs[i][0], recs[i][1]), hl, src)));
  if (ledger) ledger.record(hl.listsHash, hl.epsilon, hl.delta, key === null ? null : [key, reports, String(roundId)]);
  return { id, headlist: hl.contentHash, reports };
}

/**
 * A key of a device's records as a multiset: SHA-256 (hex) of their JSON rows [query, url], sorted, joined by
 * newlines, as Python's device ledger computes it for ordinary text. The memo is reused for the same records only;
 * the records themselves are never stored.
 */
export function recordsKey(records) {
  const rows = records.map(([q, u]) => `[${JSON.stringify(q)}, ${JSON.stringify(u ?? null)}]`).sort();
  return sha256Hex(new TextEncoder().encode(rows.join("\n")));
}

// ----- the device ledger ------------------------------------------------------------------------

/** Python math.fsum: the correctly rounded sum (Shewchuk's partials). */
function fsum(values) {
  const partials = [];
  for (let x of values) {
    let i = 0;
    for (let y of partials) {
      if (Math.abs(x) < Math.abs(y)) [x, y] = [y, x];
      const hi = x + y;
      const lo = y - (hi - x);
      if (lo !== 0) partials[i++] = lo;
      x = hi;
    }
    partials.length = i;
    partials.push(x);
  }
  let n = partials.length;
  if (n === 0) return 0.0;
  let hi = partials[--n];
  let lo = 0;
  while (n > 0) {
    const x = hi;
    const y = partials[--n];
    hi = x + y;
    lo = y - (hi - x);
    if (lo !== 0) break;
  }
  if (n > 0 && ((lo < 0 && partials[n - 1] < 0) || (lo > 0 && partials[n - 1] > 0))) {
    const y = lo * 2;
    const x = hi + y;
    if (y === x - hi) hi = x;
  }
  return hi;
}

const LEDGER_FIX = "Restore it from a backup; do not delete it, since a new ledger would forget the budget this "
  + "device has already spent.";

function formatG(x, digits) { // Python "{:.Ng}"
  if (x === 0) return "0";
  const exp = Math.floor(Math.log10(Math.abs(x)));
  if (exp < -4 || exp >= digits) {
    const [m, e] = x.toExponential(digits - 1).split("e");
    const mm = m.includes(".") ? m.replace(/\.?0+$/, "") : m;
    const n = parseInt(e, 10);
    return `${mm}e${n < 0 ? "-" : "+"}${String(Math.abs(n)).padStart(2, "0")}`;
  }
  const s = x.toFixed(Math.max(0, digits - 1 - exp));
  return s.includes(".") ? s.replace(/\.?0+$/, "") : s;
}

function parseLedger(data, where) {
  if (!data.trim()) {
    throw new DeviceError(`${where} is empty: something other than hybriddp-device cleared it. ${LEDGER_FIX}`);
  }
  let state;
  try {
    state = JSON.parse(data);
  } catch (exc) {
    throw new DeviceError(`${where} is not valid JSON (${exc.message}), so it is damaged or not a device `
      + `ledger. ${LEDGER_FIX}`);
  }
  const shape = '{"lifetime": {"epsilon": E, "delta": D}, "rounds": {...}}';
  const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  if (!isObj(state) || !isObj(state.lifetime) || !isObj(state.rounds)) {
    const found = !isObj(state) ? `${kind(fromJs(state))} ${show(fromJs(state), 40)}`
      : `an object with ${Object.keys(state).slice(0, 5).map((k) => show(k, 20)).join(", ") || "no fields"}`;
    throw new DeviceError(`${where}: expected a JSON object ${shape}, found ${found}; it is damaged or not a `
      + `device ledger. ${LEDGER_FIX}`);
  }
  for (const [name, allowed, ok] of [["epsilon", "a finite number > 0", (x) => x > 0 && x < Infinity],
    ["delta", "a number in (0, 1)", (x) => x > 0 && x < 1]]) {
    if (!Object.hasOwn(state.lifetime, name)) {
      throw new DeviceError(`${where}: field 'lifetime' has no '${name}'. ${LEDGER_FIX}`);
    }
    checkNumber(`${where}: field lifetime.${name}`, fromJs(state.lifetime[name]), allowed, ok,
      LEDGER_FIX);
  }
  for (const [key, charge] of Object.entries(state.rounds)) {
    if (!isObj(charge) || !Object.hasOwn(charge, "epsilon") || !Object.hasOwn(charge, "delta")) {
      throw new DeviceError(`${where}: round ${show(key, 30)} = ${show(fromJs(charge), 40)}; it must be an `
        + `object {"epsilon": e, "delta": d}. ${LEDGER_FIX}`);
    }
    checkNumber(`${where}: rounds[${show(key, 30)}].epsilon`, fromJs(charge.epsilon),
      "a finite number >= 0", (x) => x >= 0 && x < Infinity, LEDGER_FIX);
    checkNumber(`${where}: rounds[${show(key, 30)}].delta`, fromJs(charge.delta), "a number in [0, 1]",
      (x) => x >= 0 && x <= 1, LEDGER_FIX);
  }
  return state;
}

/**
 * The device's own privacy ledger: at most one report per head list (round), within a lifetime
 * budget. The state {"lifetime": {"epsilon": E, "delta": D}, "rounds": {hash: {"epsilon": e, "delta": d}}}
 * is kept as JSON in `storage` (localStorage by default; anything with getItem/setItem) under
 * `key`, and written *before* any report leaves the device. A new ledger needs its lifetime
 * budget; an existing one keeps the budget it was created with.
 */
export class DeviceLedger {
  constructor(storage = globalThis.localStorage, { lifetimeEpsilon, lifetimeDelta, key = LEDGER_KEY } = {}) {
    if (!storage || typeof storage.getItem !== "function" || typeof storage.setItem !== "function") {
      throw new DeviceError("device ledger: no storage (an object with getItem/setItem, e.g. localStorage) is "
        + "available, so the device cannot keep track of its privacy budget; not reporting");
    }
    this.storage = storage;
    this.key = key;
    this.where = `device ledger (storage key '${key}')`;
    const data = this._read();
    if (data === null) {
      if (lifetimeEpsilon === undefined || lifetimeEpsilon === null || lifetimeDelta === undefined
          || lifetimeDelta === null) {
        throw new DeviceError(`${this.where} does not exist; to create it give the device's lifetime budget `
          + "({lifetimeEpsilon, lifetimeDelta})");
      }
      checkNumber("lifetime epsilon (lifetimeEpsilon)", fromJs(lifetimeEpsilon, "epsilon"), "a finite number > 0",
        (x) => x > 0 && x < Infinity, "");
      checkNumber("lifetime delta (lifetimeDelta)", fromJs(lifetimeDelta, "delta"), "a number in (0, 1)",
        (x) => x > 0 && x < 1, "");
      this.state = { lifetime: { epsilon: Number(lifetimeEpsilon), delta: Number(lifetimeDelta) }, rounds: {} };
      return;
    }
    this.state = parseLedger(data, this.where);
    for (const [name, given] of [["epsilon", lifetimeEpsilon], ["delta", lifetimeDelta]]) {
      if (given !== undefined && given !== null && Number(given) !== this.state.lifetime[name]) {
        throw new DeviceError(`${this.where} has lifetime ${name} ${pyFloatRepr(this.state.lifetime[name])}, not `
          + `${given}: a device's lifetime budget is fixed when its ledger is created; leave out lifetime`
          + `${name[0].toUpperCase()}${name.slice(1)}`);
      }
    }
  }

  _read() {
    try {
      return this.storage.getItem(this.key);
    } catch (exc) {
      throw new DeviceError(`cannot read ${this.where}: ${exc.message ?? exc}; not reporting`);
    }
  }

  /** Re-read the state (another tab may have reported); keep ours if the storage was cleared. */
  _reload() {
    const data = this._read();
    if (data !== null) this.state = parseLedger(data, this.where);
  }

  /** {epsilon, delta}: the device's lifetime budget. */
  get lifetime() {
    return { ...this.state.lifetime };
  }

  /** True if this device already reported for the head list with this content hash. */
  hasReported(headlistHash) {
    this._reload();
    return Object.hasOwn(this.state.rounds, headlistHash);
  }

  /** {epsilon: Σε, delta: Σδ} over the head lists reported so far (basic composition). */
  spent() {
    this._reload();
    const rounds = Object.values(this.state.rounds);
    return { epsilon: fsum(rounds.map((r) => r.epsilon)), delta: fsum(rounds.map((r) => r.delta)) };
  }

  /** Throw DeviceError if record() would refuse this head list; change nothing. */
  check(headlistHash, epsilon, delta) {
    this._reload();
    if (Object.hasOwn(this.state.rounds, headlistHash)) {
      throw new DeviceError(`this device already reported for head list ${String(headlistHash).slice(0, 19)}…; `
        + "a device reports at most once per round");
    }
    const { epsilon: e, delta: d } = this.spent();
    const life = this.state.lifetime;
    if (e + epsilon > life.epsilon * (1 + 1e-12) || d + delta > life.delta * (1 + 1e-12)) {
      throw new DeviceError(`reporting would exceed this device's lifetime budget (epsilon `
        + `${pyFloatRepr(life.epsilon)}, delta ${pyFloatRepr(life.delta)}; spent ${formatG(e, 4)}, `
        + `${formatG(d, 3)}); not reporting`);
    }
  }

  /**
   * Charge one head list (round), or throw DeviceError (already reported / over budget / not saved).
   * memo: [records key, reports, service round id] kept with the charge, in the same write, for memoized().
   */
  record(headlistHash, epsilon, delta, memo = null) {
    this.check(headlistHash, epsilon, delta);
    this.state.rounds[headlistHash] = { epsilon: Number(epsilon), delta: Number(delta) };
    if (memo) {
      this.state.memo = this.state.memo ?? {};
      this.state.memo[headlistHash] = { records: memo[0], reports: memo[1], sent_in: [memo[2]] };
    }
    try {
      this._save();
    } catch (exc) {
      delete this.state.rounds[headlistHash];
      if (this.state.memo) delete this.state.memo[headlistHash];
      throw new DeviceError(`cannot write ${this.where} (${exc.message ?? exc}); nothing was charged, so nothing `
        + "may be reported");
    }
  }

  _save() {
    this.storage.setItem(this.key, JSON.stringify(this.state));
  }

  /**
   * Whether memoized() would give reports for these arguments: read only (nothing is noted), so a caller can skip
   * a check that would refuse the head list as already reported before it asks for anything else.
   */
  canResend(headlistHash, roundId) {
    return this._resendable(headlistHash, roundId) !== null;
  }

  /** The kept memo of this head list if it may be sent in service round `roundId`, else null (state reloaded). */
  _resendable(headlistHash, roundId) {
    this._reload();
    const memo = this.state.memo;
    const got = memo && typeof memo === "object" ? memo[headlistHash] : undefined;
    return got && Array.isArray(got.reports) && Array.isArray(got.sent_in) && !got.sent_in.includes(roundId)
      ? got : null;
  }

  /**
   * The reports this device sent for the head list `headlistHash`, if it kept them and has not sent them in
   * service round `roundId` yet; null otherwise. Sending them again in another round with the same head list is
   * post-processing: no privacy is spent (ALGORITHM.md §15). Whether they are sent does not depend on the device's
   * records now (the kept key only says whether they were made from the same ones). The round is noted (one
   * message per round).
   */
  memoized(headlistHash, roundId) {
    const got = this._resendable(headlistHash, roundId);
    if (got === null) return null;
    got.sent_in.push(roundId);
    try {
      this._save();
    } catch (exc) {
      got.sent_in.pop();
      throw new DeviceError(`cannot write ${this.where} (${exc.message ?? exc}); not reporting`);
    }
    return got.reports.map((r) => ({ ...r }));
  }

  /**
   * Whether this device reports in `period` (from 0) of series `seriesId` under "one period in `every`"
   * (ALGORITHM.md §15): in each block of `every` periods the device draws one slot uniformly, on the device
   * (`below(n)`, default the OS's randomness), the first time it asks, and keeps it; so at most one per block.
   */
  takesPart(seriesId, period, every, below = (n) => systemSource().below(n)) {
    if (!Number.isInteger(every) || every < 1) throw new DeviceError(`participation: one period in ${every}? `
      + "give an integer >= 1");
    if (!Number.isInteger(period) || period < 0) throw new DeviceError(`the round's period ${period} is not an `
      + "integer >= 0; not reporting");
    if (every === 1) return true;
    this._reload();
    const key = `${seriesId}/${every}/${Math.floor(period / every)}`;
    this.state.slots = this.state.slots ?? {};
    if (!Object.hasOwn(this.state.slots, key)) {
      const slot = below(every);
      if (!Number.isInteger(slot) || slot < 0 || slot >= every) {
        throw new DeviceError(`participation slot ${slot} is not in [0, ${every})`);
      }
      this.state.slots[key] = slot;
      try {
        this._save();
      } catch (exc) {
        delete this.state.slots[key];
        throw new DeviceError(`cannot write ${this.where} (${exc.message ?? exc}); not reporting`);
      }
    }
    return period % every === this.state.slots[key];
  }
}

// ----- report tokens (docs/TOKENS.md) -----------------------------------------------------------
// The client side of the anonymous report tokens (protocol v2, docs/TOKENS.md): Privacy Pass publicly verifiable
// tokens (RFC 9578 §6, token type 0x0002) with a random nonce, issued blind with RSABSSA-SHA384-PSS-Deterministic
// (RFC 9474) BEFORE the message exists, and spent by the message whose id the nonce gives. A port of
// hybriddp.core.tokens (challenge, new_nonce, message_id_for, token_input, Token, report_time, RoundKey.from_dict,
// check_committed_key, TokenRequest, spend): the same bytes from the same nonce. SHA-256, SHA-384 and the final
// RSASSA-PSS verification use WebCrypto (crypto.subtle, so a secure context: https or localhost); the RSA
// arithmetic of blinding is BigInt. All binary fields travel as URL-safe base64 without padding.

/** Privacy Pass token type 0x0002 (RFC 9578 §6): RSABSSA-SHA384-PSS-Deterministic, 2048-bit keys. */
export const TOKEN_TYPE = 2;
/** The RFC 9474 variant of token type 2. */
export const TOKEN_VARIANT = "RSABSSA-SHA384-PSS-Deterministic";
export const TOKEN_KEY_BITS = 2048;
const TOKEN_ISSUER = "hybriddp"; // the TokenChallenge's issuer_name
/** A token's nonce: 32 random bytes (RFC 9578 §2.2). */
export const NONCE_BYTES = 32;
/** The Token structure (RFC 9578 §2.2): type (2) || nonce (32) || challenge digest (32) || key id (32) || 256. */
export const TOKEN_BYTES = 2 + 32 + 32 + 32 + 256;
/** The only RSA public exponent a device accepts (a server choosing its own could tell devices apart by it). */
export const PUBLIC_EXPONENT = 65537;
const MESSAGE_ID_DOMAIN = "hybriddp message id v2\x00";
const PSS_SALT_BYTES = 48; // the variant's salt length (RFC 9474 §5)
const SHA384_BYTES = 48;
const AUTHENTICATOR_BYTES = 256;
const OID_RSA_ENCRYPTION = "2a864886f70d010101"; // 1.2.840.113549.1.1.1
const OID_RSASSA_PSS = "2a864886f70d01010a"; // 1.2.840.113549.1.1.10, what the server writes (RFC 9578 §6.5)
const KEY_FIX = "Fetch the key again from GET /api/v1/rounds/{id}/token-key of the round's server.";

function subtleCrypto() {
  const subtle = globalThis.crypto && globalThis.crypto.subtle;
  if (!subtle || typeof subtle.digest !== "function") {
    throw new DeviceError("report tokens need WebCrypto (crypto.subtle), which browsers give only to secure "
      + "contexts: serve the page over https (or from localhost); Node 20+ has it");
  }
  return subtle;
}

async function digest(algorithm, bytes) {
  return new Uint8Array(await subtleCrypto().digest(algorithm, bytes));
}

function concatBytes(...parts) {
  const out = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const uint32BE = (x) => Uint8Array.of(x >>> 24, (x >>> 16) & 255, (x >>> 8) & 255, x & 255);
const uint16BE = (x) => Uint8Array.of((x >>> 8) & 255, x & 255);
const hexOf = (bytes) => [...bytes].map((x) => x.toString(16).padStart(2, "0")).join("");

function asciiBytes(text, what) {
  if (typeof text !== "string" || !/^[\x00-\x7f]*$/.test(text)) {
    throw new DeviceError(`${what} = ${show(fromJs(text), 40)} must be an ASCII string`);
  }
  return Uint8Array.from(text, (c) => c.charCodeAt(0));
}

/** The bytes of a URL-safe base64 field (padding optional), size bytes long if given; DeviceError otherwise. */
function fromBase64url(text, field, size = undefined) {
  const want = size === undefined ? "" : ` of ${size} bytes`;
  if (typeof text !== "string" || !/^[A-Za-z0-9_-]*={0,2}$/.test(text) || text.replace(/=+$/, "").length % 4 === 1
      || (text.endsWith("=") && text.length % 4 !== 0)) {
    throw new DeviceError(`field '${field}' = ${show(fromJs(text), 30)} must be a URL-safe base64 string${want}`);
  }
  const body = text.replace(/=+$/, "");
  const out = new Uint8Array(Math.floor((body.length * 3) / 4));
  let acc = 0;
  let bits = 0;
  let j = 0;
  for (const ch of body) {
    acc = ((acc << 6) | B64URL.indexOf(ch)) & 0xffff;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[j++] = (acc >> bits) & 255;
    }
  }
  if (size !== undefined && out.length !== size) {
    throw new DeviceError(`field '${field}' must hold ${size} bytes, found ${out.length}`);
  }
  return out;
}

// BigInt arithmetic (RFC 8017 §4: OS2IP, I2OSP). Not constant time: it handles only the client's own blinding
// factor, on the client's own device (the signer's private-key operation is the server's, in GMP).
const bytesToBigInt = (bytes) => (bytes.length ? BigInt(`0x${hexOf(bytes)}`) : 0n);

function bigIntToBytes(x, length) {
  const hex = x.toString(16).padStart(2 * length, "0");
  if (hex.length > 2 * length) throw new DeviceError(`integer too large for ${length} bytes`);
  return Uint8Array.from({ length }, (_, i) => parseInt(hex.slice(2 * i, 2 * i + 2), 16));
}

const bitLength = (x) => (x === 0n ? 0 : x.toString(2).length);

function modPow(base, exp, mod) {
  let result = 1n;
  let b = base % mod;
  for (let x = exp; x > 0n; x >>= 1n) {
    if (x & 1n) result = (result * b) % mod;
    b = (b * b) % mod;
  }
  return result;
}

/** a⁻¹ mod n by the extended Euclidean algorithm, or null when gcd(a, n) ≠ 1. */
function modInverse(a, n) {
  let [t, newT, r, newR] = [0n, 1n, n, ((a % n) + n) % n];
  while (newR !== 0n) {
    const q = r / newR;
    [t, newT] = [newT, t - q * newT];
    [r, newR] = [newR, r - q * newR];
  }
  if (r !== 1n) return null;
  return t < 0n ? t + n : t;
}

function malformedKey(what) {
  throw new DeviceError(`token key: field 'public_key' is not an RSA SubjectPublicKeyInfo (${what}). ${KEY_FIX}`);
}

/** One DER TLV at bytes[pos] with this tag, inside bytes[..limit] (definite, minimal length): its content's bounds. */
function derItem(bytes, pos, tag, limit) {
  if (pos + 2 > limit || bytes[pos] !== tag) malformedKey("malformed DER");
  let len = bytes[pos + 1];
  let start = pos + 2;
  if (len & 0x80) {
    const size = len & 0x7f;
    if (size === 0 || size > 3 || start + size > limit || bytes[start] === 0) malformedKey("malformed DER");
    len = 0;
    for (let i = 0; i < size; i++) len = len * 256 + bytes[start + i];
    if (len < 0x80) malformedKey("malformed DER");
    start += size;
  }
  if (start + len > limit) malformedKey("malformed DER");
  return { start, end: start + len };
}

/**
 * [n, e] (BigInt) of the DER SubjectPublicKeyInfo of an RSA key, with the RSASSA-PSS OID (RFC 4055, as the
 * server writes it) or rsaEncryption (as Python's reader also accepts). WebCrypto is not used here: some
 * implementations refuse the RSASSA-PSS OID in importKey("spki").
 */
function parseRsaSpki(spki) {
  const outer = derItem(spki, 0, 0x30, spki.length);
  if (outer.end !== spki.length) malformedKey("trailing bytes");
  const alg = derItem(spki, outer.start, 0x30, outer.end);
  const oid = derItem(spki, alg.start, 0x06, alg.end);
  const oidHex = hexOf(spki.subarray(oid.start, oid.end));
  if (oidHex !== OID_RSASSA_PSS && oidHex !== OID_RSA_ENCRYPTION) malformedKey("not an RSA key");
  const bits = derItem(spki, alg.end, 0x03, outer.end); // BIT STRING: 0 unused bits, then RSAPublicKey
  if (bits.end !== outer.end || bits.start === bits.end || spki[bits.start] !== 0) malformedKey("malformed DER");
  const rsaKey = derItem(spki, bits.start + 1, 0x30, bits.end);
  const nItem = derItem(spki, rsaKey.start, 0x02, rsaKey.end);
  const eItem = derItem(spki, nItem.end, 0x02, rsaKey.end);
  if (rsaKey.end !== bits.end || eItem.end !== rsaKey.end) malformedKey("malformed DER");
  const n = bytesToBigInt(spki.subarray(nItem.start, nItem.end));
  const e = bytesToBigInt(spki.subarray(eItem.start, eItem.end));
  if (spki[nItem.start] & 0x80 || spki[eItem.start] & 0x80 || n % 2n === 0n || e % 2n === 0n || e < 3n || e >= n) {
    malformedKey("not a valid RSA public key");
  }
  return [n, e];
}

/**
 * The round's TokenChallenge (RFC 9578 §2.1), resolving to its bytes: type 0x0002, issuer name "hybriddp",
 * redemption context SHA-256(round id), empty origin info.
 */
export async function tokenChallenge(roundId) {
  const context = await digest("SHA-256", asciiBytes(roundId, "round id"));
  const issuer = asciiBytes(TOKEN_ISSUER, "issuer");
  return concatBytes(uint16BE(TOKEN_TYPE), uint16BE(issuer.length), issuer, Uint8Array.of(context.length), context,
    uint16BE(0));
}

function checkNonce(nonce) {
  if (!(nonce instanceof Uint8Array) || nonce.length !== NONCE_BYTES) {
    throw new DeviceError(`a token nonce must be ${NONCE_BYTES} bytes (a Uint8Array), from newNonce()`);
  }
  return nonce;
}

/**
 * A token's nonce: 32 random bytes from crypto.getRandomValues (Python new_nonce). Drawn before any message
 * exists; nothing about the device or its records goes into it.
 * options.getRandomValues: for tests only (as systemSource).
 */
export function newNonce({ getRandomValues } = {}) {
  return systemSource({ getRandomValues }).bytes(NONCE_BYTES);
}

/**
 * The id of the message that spends the token with this nonce (Python message_id_for): the first 16 bytes of
 * SHA-256("hybriddp message id v2" 0x00 || nonce) in URL-safe base64 without padding (22 characters). Synchronous
 * (plain-JS SHA-256). The server refuses a message whose id is not this one, so its table of message ids is the
 * round's table of spent nonces: the same token counts once, whatever message carries it.
 */
export function messageIdFor(nonce) {
  const hex = sha256Hex(concatBytes(asciiBytes(MESSAGE_ID_DOMAIN, "domain"), checkNonce(nonce)));
  return base64url(Uint8Array.from({ length: MESSAGE_ID_BYTES }, (_, i) => parseInt(hex.slice(2 * i, 2 * i + 2), 16)));
}

/**
 * token_input = 0x0002 || nonce || SHA-256(TokenChallenge) || key id (RFC 9578 §6.1; 98 bytes), what the
 * authenticator signs. No message goes into it. Resolves to the bytes.
 * keyId: the 32-byte key id (parseTokenKey(...).keyId); nonce: 32 bytes (newNonce()).
 */
export async function tokenInput(roundId, keyId, nonce) {
  if (!(keyId instanceof Uint8Array) || keyId.length !== 32) {
    throw new DeviceError("tokenInput: keyId must be the 32-byte key id (a Uint8Array), from parseTokenKey");
  }
  checkNonce(nonce);
  const challengeHash = await digest("SHA-256", await tokenChallenge(roundId));
  return concatBytes(uint16BE(TOKEN_TYPE), nonce, challengeHash, keyId);
}

/** The Token structure (RFC 9578 §2.2) of a token input and its 256-byte authenticator, as URL-safe base64. */
export function encodeToken(input, authenticator) {
  if (!(input instanceof Uint8Array) || input.length !== TOKEN_BYTES - AUTHENTICATOR_BYTES
      || input[0] !== 0 || input[1] !== TOKEN_TYPE) {
    throw new DeviceError("encodeToken: input must be a 98-byte type-2 token input, from tokenInput");
  }
  if (!(authenticator instanceof Uint8Array) || authenticator.length !== AUTHENTICATOR_BYTES) {
    throw new DeviceError(`encodeToken: the authenticator must be ${AUTHENTICATOR_BYTES} bytes`);
  }
  return base64url(concatBytes(input, authenticator));
}

/**
 * A message's "token" read as the RFC 9578 §2.2 Token structure (Python Token.parse): resolves nothing, returns
 * a frozen {nonce, challengeDigest, keyId, authenticator, input (the 98 signed bytes), messageId}; DeviceError if it
 * is not 354 bytes of token type 2. It checks the shape only, not the authenticator.
 */
export function parseToken(text, field = "token") {
  const raw = fromBase64url(text, field, TOKEN_BYTES);
  if (raw[0] !== 0 || raw[1] !== TOKEN_TYPE) {
    throw new DeviceError(`${field}: token type ${hexOf(raw.subarray(0, 2))} is not 0002 (RFC 9578 §6)`);
  }
  const nonce = raw.slice(2, 34);
  return Object.freeze({ nonce, challengeDigest: raw.slice(34, 66), keyId: raw.slice(66, 98),
    authenticator: raw.slice(98), input: raw.slice(0, 98), messageId: messageIdFor(nonce) });
}

// ----- the schedule (spec v2 §3.4) ----------------------------------------------------------------

const TIME_RE = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d{1,6})?Z$/;

/** Seconds since the epoch of "YYYY-MM-DDTHH:MM:SS[.ffffff]Z" (Python parse_time); DeviceError otherwise. */
export function parseTime(text, field = "time") {
  const m = typeof text === "string" ? TIME_RE.exec(text) : null;
  const ms = m ? Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +m[6]) : NaN;
  const d = new Date(ms);
  if (!m || Number.isNaN(ms) || d.getUTCDate() !== +m[3] || d.getUTCMonth() !== +m[2] - 1 || +m[4] > 23
      || +m[5] > 59 || +m[6] > 59) {
    throw new DeviceError(`field '${field}' = ${show(fromJs(text), 44)} must be a UTC time like `
      + "'2026-11-28T19:00:00Z'");
  }
  return ms / 1000 + (m[7] ? Number(`0${m[7]}`) : 0);
}

/** A head list's report_window as [opens, closes] in epoch seconds, or null when it has none (Python report_window). */
export function reportWindow(doc) {
  const win = doc?.report_window;
  if (win === undefined || win === null) return null;
  if (typeof win !== "object" || Array.isArray(win)) {
    throw new DeviceError('field \'report_window\' must be an object {"opens": time, "closes": time}');
  }
  const opens = parseTime(win.opens, "report_window.opens");
  const closes = parseTime(win.closes, "report_window.closes");
  if (closes < opens) {
    throw new DeviceError(`field 'report_window': closes (${win.closes}) is before opens (${win.opens})`);
  }
  return [opens, closes];
}

/**
 * When the device sends its message (spec v2 §3.4, Python report_time), in unix seconds: uniform in the head
 * list's report window, independent of when the token was got. Before the window opens: U(opens, closes); inside
 * it: U(now, closes); after it closes, or with no window: now; a window of no length not yet reached: its instant.
 * doc: the head-list document; nowSeconds: now (default Date.now()/1000); random: a function giving a uniform in
 * [0, 1) or a source with uniform() (default systemSource(), the OS's randomness).
 */
export function reportTime(doc, nowSeconds = Date.now() / 1000, random = undefined) {
  const window = reportWindow(doc);
  if (window === null) return nowSeconds;
  const [opens, closes] = window;
  const start = Math.max(nowSeconds, opens);
  if (nowSeconds >= closes) return nowSeconds;
  if (start >= closes) return start; // a window of no length not yet reached: its one instant, not now
  const u = typeof random === "function" ? random() : (random ?? systemSource()).uniform();
  return start + u * (closes - start);
}

/**
 * The outbox entry {message, send_at} (spec v2 §3.3) of a message with its token: send_at = reportTime(doc, ...).
 * options.reportNow: send_at = now, for tests and simulations ONLY: it gives up unlinkability (the server sees
 * the issuance and the report together).
 */
export function outboxEntry(message, doc, { reportNow = false, nowSeconds = Date.now() / 1000, random } = {}) {
  const sendAt = reportNow ? nowSeconds : reportTime(doc, nowSeconds, random);
  return { message, send_at: sendAt };
}

// ----- the round's committed key -------------------------------------------------------------------

/**
 * Check a round's token key as fetched from GET /api/v1/rounds/{id}/token-key (Python RoundKey.from_dict with
 * the head list's commitment): token type 2, made for roundId, a 2048-bit RSA SubjectPublicKeyInfo with public
 * exponent 65537, key_id = SHA-256(public_key), and (checkCommittedKey) exactly the key the head-list document
 * `headlistDoc` commits to in its `token_key` (key id, modulus bits, exponent). A head list without `token_key`
 * is refused ("published before keys were committed"). Resolves to a frozen {roundId, spki, keyId (Uint8Array),
 * n, e (BigInt), modulusBytes, publicKey (CryptoKey for RSA-PSS SHA-384 verification)}; rejects with DeviceError
 * naming what differs otherwise.
 */
export async function parseTokenKey(doc, roundId, headlistDoc) {
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    throw new DeviceError('token key: expected a JSON object {"public_key", "key_id", ...}');
  }
  if (doc.token_type !== TOKEN_TYPE || doc.round !== roundId) {
    throw new DeviceError(`token key: made for token type ${show(fromJs(doc.token_type), 20)} and round `
      + `${show(String(doc.round).slice(0, 40), 44)}; expected ${TOKEN_TYPE} and ${roundId}`);
  }
  const spki = fromBase64url(doc.public_key, "public_key");
  const [n, e] = parseRsaSpki(spki);
  const keyId = await digest("SHA-256", spki);
  const given = fromBase64url(doc.key_id, "key_id", 32);
  if (bitLength(n) !== TOKEN_KEY_BITS || hexOf(given) !== hexOf(keyId)) {
    throw new DeviceError("token key: not a 2048-bit key, or 'key_id' is not SHA-256 of 'public_key'. " + KEY_FIX);
  }
  if (e !== BigInt(PUBLIC_EXPONENT)) {
    throw new DeviceError(`token key: public exponent ${e} is not ${PUBLIC_EXPONENT}; a device accepts no other (a `
      + "server could tell devices apart by their keys' exponents). Nothing was sent");
  }
  checkCommittedKey({ keyId, n, e }, headlistDoc?.token_key);
  const modulusBytes = Math.ceil(bitLength(n) / 8);
  const bigB64 = (x) => base64url(bigIntToBytes(x, Math.ceil(bitLength(x) / 8)));
  let publicKey;
  try {
    publicKey = await subtleCrypto().importKey("jwk", { kty: "RSA", n: bigB64(n), e: bigB64(e), alg: "PS384",
      ext: true }, { name: "RSA-PSS", hash: "SHA-384" }, false, ["verify"]);
  } catch (exc) {
    throw new DeviceError(`token key: WebCrypto refuses the key (${exc.message ?? exc}). ${KEY_FIX}`);
  }
  return Object.freeze({ roundId, spki, keyId, n, e, modulusBytes, publicKey });
}

/**
 * Refuse (DeviceError) a key {keyId, n, e} that is not the one a head list commits to in `committed` (its
 * `token_key`, Python check_committed_key): SHA-256(SPKI) must be its key_id, both exponents 65537, the modulus
 * at least 2048 bits and of the committed size. What this guarantees: a server that handed each device its own key
 * (to tell later which device a token came from) would have to hand each its own head list, whose content hash
 * differs, which checkMirror exposes.
 */
export function checkCommittedKey(key, committed, source = "token key") {
  if (committed === null || typeof committed !== "object" || Array.isArray(committed)) {
    throw new DeviceError(`${source}: the head list commits to no token key (field 'token_key'); it was published `
      + "before round keys were committed, or by a server that does not commit them. Nothing was sent; ask the "
      + "operator to publish the round again");
  }
  const want = fromBase64url(committed.key_id, "token_key.key_id", 32);
  if (hexOf(want) !== hexOf(key.keyId)) {
    throw new DeviceError(`${source}: key ${base64url(key.keyId).slice(0, 12)}… is not the key the head list commits `
      + `to (${base64url(want).slice(0, 12)}…): the server may be telling devices apart by their keys. Nothing was `
      + "sent");
  }
  if (committed.e !== PUBLIC_EXPONENT || key.e !== BigInt(PUBLIC_EXPONENT)) {
    throw new DeviceError(`${source}: exponent ${show(fromJs(committed.e), 30)} (key: ${key.e}); only `
      + `${PUBLIC_EXPONENT} is accepted. Nothing was sent`);
  }
  const bits = committed.modulus_bits;
  if (!Number.isInteger(bits) || bits < TOKEN_KEY_BITS || bits !== bitLength(key.n)) {
    throw new DeviceError(`${source}: modulus of ${bitLength(key.n)} bits, the head list says `
      + `${show(fromJs(bits), 30)}; at least ${TOKEN_KEY_BITS} bits and the two equal are needed. Nothing was sent`);
  }
}

/** MGF1 with SHA-384 (RFC 8017 §B.2.1). */
async function mgf1Sha384(seed, length) {
  const blocks = [];
  for (let i = 0; i * SHA384_BYTES < length; i++) blocks.push(await digest("SHA-384", concatBytes(seed, uint32BE(i))));
  return concatBytes(...blocks).subarray(0, length);
}

/** EMSA-PSS-ENCODE with SHA-384 and MGF1-SHA-384 (RFC 8017 §9.1.1), the salt given. */
async function emsaPssEncode(msg, emBits, salt) {
  const emLen = Math.ceil(emBits / 8);
  if (emLen < SHA384_BYTES + salt.length + 2) throw new DeviceError(`a ${emBits + 1}-bit key is too small for PSS`);
  const mHash = await digest("SHA-384", msg);
  const h = await digest("SHA-384", concatBytes(new Uint8Array(8), mHash, salt));
  const db = new Uint8Array(emLen - SHA384_BYTES - 1); // PS (zeros) || 0x01 || salt
  db[db.length - salt.length - 1] = 1;
  db.set(salt, db.length - salt.length);
  const mask = await mgf1Sha384(h, db.length);
  for (let i = 0; i < db.length; i++) db[i] ^= mask[i];
  db[0] &= 0xff >> (8 * emLen - emBits); // clear the leftmost 8·emLen − emBits bits
  return concatBytes(db, h, Uint8Array.of(0xbc));
}

/** Uniform in [1, n) by rejection sampling (RFC 9474 §4.2; the same bytes give Python's _random_below). */
function randomBelow(n, source) {
  const k = Math.ceil(bitLength(n) / 8);
  const excess = BigInt(8 * k - bitLength(n));
  for (;;) {
    const x = bytesToBigInt(source.bytes(k)) >> excess;
    if (x >= 1n && x < n) return x;
  }
}

function checkKey(key) {
  if (!key || typeof key.n !== "bigint" || typeof key.e !== "bigint" || !(key.keyId instanceof Uint8Array)
      || !key.publicKey) {
    throw new DeviceError("the token key must be the object parseTokenKey(doc, roundId, headlist) resolves to");
  }
}

/**
 * Blind a token input (RFC 9474 §4.2, RSABSSA-SHA384-PSS-Deterministic) under a key from parseTokenKey.
 * The lower-level step of requestToken (use that): resolves to {blinded (base64url), finalize}, where
 * `await finalize(blindSig)` is the authenticator (base64url RSASSA-PSS signature over the input), verified.
 * options.getRandomValues: for tests only (as systemSource); the default is crypto.getRandomValues.
 */
export async function blindTokenInput(key, input, { getRandomValues } = {}) {
  return blindWith(key, input, systemSource({ getRandomValues }));
}

async function blindWith(key, input, source) {
  checkKey(key);
  const { n, e, modulusBytes: k } = key;
  const salt = source.bytes(PSS_SALT_BYTES); // draws: the 48-byte salt, then r (as Python)
  const m = bytesToBigInt(await emsaPssEncode(input, bitLength(n) - 1, salt)); // emBits = bit_len(n) − 1
  if (modInverse(m, n) === null) {
    throw new DeviceError("invalid input: the encoded message is not co-prime with n (is the token key valid?)");
  }
  let r;
  let inv;
  do {
    r = randomBelow(n, source);
    inv = modInverse(r, n);
  } while (inv === null); // r shares a factor with n: probability ~2^-1023 for a valid key
  const blinded = base64url(bigIntToBytes((m * modPow(r, e, n)) % n, k)); // m · r^e mod n
  r = null;
  return {
    blinded,
    async finalize(blindSig) {
      const z = bytesToBigInt(fromBase64url(blindSig, "blind_sig", k));
      const sig = bigIntToBytes((z * inv) % n, k); // RFC 9474 §4.4: s = z · r⁻¹ mod n
      const valid = await subtleCrypto().verify({ name: "RSA-PSS", saltLength: PSS_SALT_BYTES }, key.publicKey, sig,
        input);
      if (!valid) {
        throw new DeviceError(`the issuer's answer is not a valid blind signature under key `
          + `${base64url(key.keyId).slice(0, 12)}…: the unblinded signature does not verify`);
      }
      return base64url(sig);
    },
  };
}

/**
 * Start a report token (Python TokenRequest.make), before any message exists: key from
 * parseTokenKey(doc, roundId, headlist). Draws a fresh nonce (options.nonce: a given one, for tests) and blinds
 * token_input(nonce). Resolves to {nonce, messageId, tokenInput, blinded, finalize}: send `blinded` (base64url) to
 * POST /api/v1/rounds/{id}/tokens; `await finalize(blindSig)` turns the issuer's answer into the token, the
 * base64url Token structure (354 bytes), verifying it, or rejects with DeviceError. The blinding factor never
 * leaves the closure; the issuer sees only m·r^e mod n, uniformly distributed whatever the nonce.
 * options.getRandomValues: for tests only, as systemSource (draws: the nonce if not given, the salt, then r).
 */
export async function requestToken(key, roundId, { nonce, getRandomValues } = {}) {
  checkKey(key);
  if (key.roundId !== roundId) {
    throw new DeviceError(`the token key is round ${show(fromJs(key.roundId), 40)}'s, not ${show(roundId, 40)}'s`);
  }
  const source = systemSource({ getRandomValues });
  const n = nonce === undefined ? source.bytes(NONCE_BYTES) : checkNonce(nonce);
  const input = await tokenInput(roundId, key.keyId, n);
  const blind = await blindWith(key, input, source);
  return {
    nonce: n,
    messageId: messageIdFor(n),
    tokenInput: input,
    blinded: blind.blinded,
    async finalize(blindSig) {
      return encodeToken(input, fromBase64url(await blind.finalize(blindSig), "authenticator"));
    },
  };
}

/** The JSON answer of a fetch, or DeviceError with the server's message ({"error": {"code", "message"}}). */
async function answerOf(request, what) {
  let resp;
  try {
    resp = await request();
  } catch (exc) {
    throw new DeviceError(`${what}: the server cannot be reached (${exc.message ?? exc})`);
  }
  const text = await resp.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // left null: reported below
  }
  if (!resp.ok) {
    const err = body !== null && typeof body === "object" ? body.error : undefined;
    const code = err && typeof err.code === "string" ? err.code : undefined;
    const detail = err && typeof err.message === "string" ? err.message : text.slice(0, 200);
    const exc = new DeviceError(`${what}: refused (HTTP ${resp.status}${code ? ` ${code}` : ""}): ${detail}`);
    exc.status = resp.status;
    exc.code = code;
    const retry = resp.headers && typeof resp.headers.get === "function" ? resp.headers.get("Retry-After") : null;
    if (retry !== null && /^\d+$/.test(retry.trim())) exc.retryAfter = Number(retry.trim());
    throw exc;
  }
  if (body === null || typeof body !== "object") {
    throw new DeviceError(`${what}: the server's answer is not a JSON object (HTTP ${resp.status})`);
  }
  return body;
}

const apiOf = (baseUrl, roundId) => `${String(baseUrl).replace(/\/+$/, "")}/api/v1/rounds/${encodeURIComponent(roundId)}`;
// every request of the module: no cookies, no cache, no referrer (nothing of the page that could tie requests)
const QUIET = { credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer" };

/**
 * Get a report token ahead of the message (spec v2 §3.1-3.3; Python DeviceClient): fetch the round's token key,
 * refuse it unless it is the key the head-list document `doc` commits to (parseTokenKey), blind a fresh random
 * nonce, have the server sign it with the device credential, unblind and verify. Resolves to
 * {token (base64url Token struct), messageId (the id of the message that will spend it), keyId (base64url)}.
 * A server with open admission (the key document's "admission": "open") takes messages without a token: then
 * {token: null, messageId: a random id, admission: "open"} and nothing is posted.
 * Call it when the head list is downloaded, on its own: the token carries nothing of the message made later.
 * fetchFn: fetch, a stand-in, or ohttpFetch(relayUrl, keyConfig) so the server sees the relay, not the device;
 * baseUrl: the server ("" for the page's own origin); credential: the device credential (bearer secret).
 * Rejects with DeviceError naming the refusal; its `status` and `code` are the HTTP status and error code (e.g.
 * 403 "issuance_limit": this credential's tokens for the round are used up).
 * options.getRandomValues, options.nonce: for tests only (as requestToken).
 */
export async function fetchToken(fetchFn, baseUrl, roundId, credential, doc, { getRandomValues, nonce } = {}) {
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    throw new DeviceError("fetchToken: give the round's head-list document (its token_key is the committed key)");
  }
  const api = apiOf(baseUrl, roundId);
  const keyDoc = await answerOf(() => fetchFn(`${api}/token-key`, { ...QUIET,
    headers: { Accept: "application/json" } }), `token key of round ${roundId}`);
  if (keyDoc !== null && keyDoc.admission === "open") {
    return { token: null, messageId: newMessageId(), admission: "open" };
  }
  const key = await parseTokenKey(keyDoc, roundId, doc);
  if (typeof credential !== "string" || !credential.trim()) {
    throw new DeviceError(`round ${roundId}: this server takes reports only with a report token, and tokens need a `
      + "device credential (the administrator makes them: `hybriddp credentials create`); see docs/TOKENS.md");
  }
  const req = await requestToken(key, roundId, { nonce, getRandomValues });
  const answer = await answerOf(() => fetchFn(`${api}/tokens`, {
    ...QUIET,
    method: "POST",
    headers: { Authorization: `Bearer ${credential.trim()}`, "Content-Type": "application/json",
      Accept: "application/json" },
    body: JSON.stringify({ blinded_msgs: [req.blinded] }),
  }), `token issuance for round ${roundId}`);
  if (!Array.isArray(answer.blind_sigs) || answer.blind_sigs.length !== 1) {
    throw new DeviceError(`token issuance for round ${roundId}: expected {"blind_sigs": [one signature]}, found `
      + `${show(fromJs(answer.blind_sigs), 40)}`);
  }
  return { token: await req.finalize(answer.blind_sigs[0]), messageId: req.messageId, keyId: base64url(key.keyId) };
}

/**
 * The message that spends `token` (Python spend): a copy of `message` with the id derived from the token's nonce
 * and the token. `token`: what fetchToken resolved to ({token, messageId}; with token null, open admission, only
 * its messageId is set) or a token string. A message keeps this id and token for every retry (counted once).
 */
export function attachToken(message, token) {
  if (message === null || typeof message !== "object" || Array.isArray(message)) {
    throw new DeviceError(`message = ${show(fromJs(message), 40)} is not an object`);
  }
  if (token !== null && typeof token === "object" && token.token === null) {
    return { ...message, id: checkMessageId(token.messageId) };
  }
  const text = token !== null && typeof token === "object" ? token.token : token;
  const parsed = parseToken(text);
  if (token !== null && typeof token === "object" && token.messageId !== undefined
      && token.messageId !== parsed.messageId) {
    throw new DeviceError("attachToken: the given messageId is not the one the token's nonce gives");
  }
  const { token: _old, ...rest } = message;
  return { ...rest, id: parsed.messageId, token: text };
}

/**
 * POST a message (with its token) to /api/v1/rounds/{id}/reports; resolves to the server's acknowledgement
 * ({"counted": 1} the first time, 0 for a duplicate). Rejects with DeviceError carrying `status`, `code` and, for
 * 409 "too_few_tokens" (the round has issued fewer than its min_tokens), `retryAfter` seconds: keep the message
 * in the outbox and send the same one again later. fetchFn may be ohttpFetch(...).
 */
export async function sendReport(fetchFn, baseUrl, roundId, message) {
  return answerOf(() => fetchFn(`${apiOf(baseUrl, roundId)}/reports`, {
    ...QUIET,
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(message),
  }), `report to round ${roundId}`);
}

/**
 * Consistency check (spec v2 §3.2): fetch the round's head list from a mirror (`GET {mirrorUrl}/api/v1/rounds/{id}/
 * headlist`: another party, e.g. the OHTTP relay, which serves one cached copy to all its devices) and refuse
 * (DeviceError, nothing sent) unless its content hash, recomputed here, equals `contentHash`, the hash of the copy
 * the device got directly. What this guarantees: a server that gave this device a head list of its own (another
 * key, another window) is caught unless it also controls the mirror. Resolves to the mirror's content hash.
 */
export async function checkMirror(fetchFn, mirrorUrl, roundId, contentHash) {
  const url = `${apiOf(mirrorUrl, roundId)}/headlist`;
  const doc = await answerOf(() => fetchFn(url, { ...QUIET, headers: { Accept: "application/json" } }),
    `mirror head list of round ${roundId}`);
  let actual;
  try {
    actual = await hashTree(fromJsTop(doc));
  } catch (exc) {
    throw new DeviceError(`mirror ${mirrorUrl}: its head list cannot be hashed (${exc.message}); not reporting`);
  }
  if (doc.content_hash !== actual || actual !== contentHash) {
    throw new DeviceError(`mirror ${mirrorUrl}: round ${roundId}'s head list there has content hash `
      + `${String(actual).slice(0, 19)}…, the server gave this device ${String(contentHash).slice(0, 19)}…: the server `
      + "may be showing devices different head lists (keys); nothing was sent");
  }
  return actual;
}

// ----- Oblivious HTTP (RFC 9458) with HPKE (RFC 9180) and binary HTTP (RFC 9292), spec v2 §4 ------------------
// The client side only: HPKE base-mode sender (SetupBaseS, Seal, Export) for the suite DHKEM(P-256, HKDF-SHA256)
// 0x0010, HKDF-SHA256 0x0001, AES-128-GCM 0x0001; OHTTP request encapsulation (§4.3) and response opening (§4.4);
// binary HTTP known-length request encoding and response decoding. Everything is WebCrypto: ECDH P-256 (key
// generation, deriveBits; importKey("raw") validates the gateway's point), AES-GCM, and HMAC-SHA256, from which
// HKDF Extract and Expand are built (HPKE's labeled forms put their labels where WebCrypto's HKDF has no room,
// and Extract's output is used on its own). Not done in WebCrypto, so not done: nothing. What the browser does not
// let a page control: the connection (fetch pools connections; the relay, not a fresh connection, is what hides
// the device's address), and the ephemeral key's erasure (a CryptoKey is dropped, not zeroed).

export const OHTTP_KEM_ID = 0x0010;
export const OHTTP_KDF_ID = 0x0001;
export const OHTTP_AEAD_ID = 0x0001;
const HPKE_NPK = 65;
const HPKE_NK = 16;
const HPKE_NN = 12;
const HPKE_NH = 32;
const OHTTP_RESPONSE_NONCE = Math.max(HPKE_NN, HPKE_NK); // 16
const textBytes = (s) => new TextEncoder().encode(s);

async function hmacSha256(key, data) {
  const k = await subtleCrypto().importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return new Uint8Array(await subtleCrypto().sign("HMAC", k, data));
}

/** HKDF-Extract (RFC 5869 §2.2) with SHA-256: an empty salt is Nh zero bytes. */
export async function hkdfExtract(salt, ikm) {
  return hmacSha256(salt.length ? salt : new Uint8Array(HPKE_NH), ikm);
}

/** HKDF-Expand (RFC 5869 §2.3) with SHA-256: `length` ≤ 255·32 bytes. */
export async function hkdfExpand(prk, info, length) {
  if (!Number.isInteger(length) || length < 0 || length > 255 * HPKE_NH) {
    throw new DeviceError(`HKDF-Expand length ${length} is out of range`);
  }
  const blocks = [];
  let block = new Uint8Array(0);
  for (let i = 1; blocks.length * HPKE_NH < length; i++) {
    block = await hmacSha256(prk, concatBytes(block, info, Uint8Array.of(i)));
    blocks.push(block);
  }
  return concatBytes(...blocks).slice(0, length);
}

const HPKE_VERSION = textBytes("HPKE-v1");
const KEM_SUITE = concatBytes(textBytes("KEM"), uint16BE(OHTTP_KEM_ID));
const HPKE_SUITE = concatBytes(textBytes("HPKE"), uint16BE(OHTTP_KEM_ID), uint16BE(OHTTP_KDF_ID),
  uint16BE(OHTTP_AEAD_ID));

const labeledExtract = (salt, label, ikm, suite = HPKE_SUITE) => hkdfExtract(salt,
  concatBytes(HPKE_VERSION, suite, textBytes(label), ikm));
const labeledExpand = (prk, label, info, length, suite = HPKE_SUITE) => hkdfExpand(prk,
  concatBytes(uint16BE(length), HPKE_VERSION, suite, textBytes(label), info), length);

async function aesGcm(op, key, nonce, aad, data) {
  const k = await subtleCrypto().importKey("raw", key, "AES-GCM", false, [op]);
  const params = { name: "AES-GCM", iv: nonce, additionalData: aad, tagLength: 128 };
  try {
    return new Uint8Array(await subtleCrypto()[op](params, k, data));
  } catch (exc) {
    if (op === "decrypt") throw new DeviceError("OHTTP: the gateway's response does not decrypt (tampered, or not "
      + "an answer to this request)");
    throw exc;
  }
}

/**
 * HPKE base-mode sender (RFC 9180 §5.1.1, DHKEM(P-256, HKDF-SHA256), HKDF-SHA256, AES-128-GCM): a fresh
 * ephemeral key (WebCrypto, never leaves the function) and one ECDH with the recipient's 65-byte uncompressed
 * public key. Resolves to {enc (65 bytes), seal(aad, pt) → ct (sequence numbers 0, 1, …), export(context, L)}.
 * options.ephemeral {privateKey: CryptoKey (ECDH P-256), publicKey: 65 bytes}: to replay RFC 9180's test vectors
 * only (a reused ephemeral key breaks confidentiality).
 */
export async function hpkeSetupBaseS(pkR, info, { ephemeral } = {}) {
  const subtle = subtleCrypto();
  if (!(pkR instanceof Uint8Array) || pkR.length !== HPKE_NPK || pkR[0] !== 4) {
    throw new DeviceError("HPKE: the recipient's key must be a 65-byte uncompressed P-256 point");
  }
  let pkRKey;
  try {
    pkRKey = await subtle.importKey("raw", pkR, { name: "ECDH", namedCurve: "P-256" }, false, []);
  } catch (exc) {
    throw new DeviceError(`HPKE: the recipient's key is not a point on P-256 (${exc.message ?? exc})`);
  }
  let skE;
  let enc;
  if (ephemeral) {
    skE = ephemeral.privateKey;
    enc = Uint8Array.from(ephemeral.publicKey);
  } else {
    const pair = await subtle.generateKey({ name: "ECDH", namedCurve: "P-256" }, false, ["deriveBits"]);
    skE = pair.privateKey;
    enc = new Uint8Array(await subtle.exportKey("raw", pair.publicKey));
  }
  const dh = new Uint8Array(await subtle.deriveBits({ name: "ECDH", public: pkRKey }, skE, 256));
  const eaePrk = await labeledExtract(new Uint8Array(0), "eae_prk", dh, KEM_SUITE);
  const sharedSecret = await labeledExpand(eaePrk, "shared_secret", concatBytes(enc, pkR), 32, KEM_SUITE);
  // key schedule, mode base (0x00), no PSK (RFC 9180 §5.1)
  const empty = new Uint8Array(0);
  const pskIdHash = await labeledExtract(empty, "psk_id_hash", empty);
  const infoHash = await labeledExtract(empty, "info_hash", info);
  const context = concatBytes(Uint8Array.of(0), pskIdHash, infoHash);
  const secret = await labeledExtract(sharedSecret, "secret", empty);
  const key = await labeledExpand(secret, "key", context, HPKE_NK);
  const baseNonce = await labeledExpand(secret, "base_nonce", context, HPKE_NN);
  const exporterSecret = await labeledExpand(secret, "exp", context, HPKE_NH);
  let seq = 0;
  return {
    enc,
    async seal(aad, pt) {
      const nonce = Uint8Array.from(baseNonce);
      for (let i = 0, s = seq; i < 6; i++, s = Math.floor(s / 256)) nonce[HPKE_NN - 1 - i] ^= s % 256;
      seq++;
      return aesGcm("encrypt", key, nonce, aad, pt);
    },
    export: (exporterContext, length) => labeledExpand(exporterSecret, "sec", exporterContext, length),
  };
}

/**
 * An RFC 9458 §3.1 KeyConfig (bytes, or its URL-safe base64 as a head list's `ohttp_key`) read and checked:
 * {keyId, publicKey (65 bytes), bytes}; DeviceError unless its KEM is 0x0010 and it offers HKDF-SHA256 with
 * AES-128-GCM (the only suite this client speaks).
 */
export function parseKeyConfig(config) {
  const bytes = typeof config === "string" ? fromBase64url(config, "ohttp_key") : config;
  if (!(bytes instanceof Uint8Array) || bytes.length < 3 + HPKE_NPK + 2) {
    throw new DeviceError("OHTTP: the key config is not an RFC 9458 KeyConfig (too short)");
  }
  const kem = (bytes[1] << 8) | bytes[2];
  const suitesLen = (bytes[3 + HPKE_NPK] << 8) | bytes[4 + HPKE_NPK];
  if (kem !== OHTTP_KEM_ID || suitesLen % 4 || suitesLen === 0 || 5 + HPKE_NPK + suitesLen !== bytes.length) {
    throw new DeviceError(`OHTTP: key config with KEM ${kem} and ${suitesLen} bytes of suites in ${bytes.length}: not `
      + "an RFC 9458 KeyConfig for DHKEM(P-256, HKDF-SHA256)");
  }
  let ok = false;
  for (let i = 5 + HPKE_NPK; i < bytes.length; i += 4) {
    if (((bytes[i] << 8) | bytes[i + 1]) === OHTTP_KDF_ID && ((bytes[i + 2] << 8) | bytes[i + 3]) === OHTTP_AEAD_ID) {
      ok = true;
    }
  }
  if (!ok) throw new DeviceError("OHTTP: the key config offers no HKDF-SHA256 / AES-128-GCM suite");
  return { keyId: bytes[0], publicKey: bytes.slice(3, 3 + HPKE_NPK), bytes: Uint8Array.from(bytes) };
}

/** The configs of an application/ohttp-keys body (RFC 9458 §3.2: length (2) || KeyConfig, repeated), parsed. */
export function parseOhttpKeys(body) {
  const out = [];
  for (let at = 0; at < body.length;) {
    const n = (body[at] << 8) | body[at + 1];
    if (at + 2 + n > body.length) throw new DeviceError("OHTTP: truncated application/ohttp-keys");
    try {
      out.push(parseKeyConfig(body.slice(at + 2, at + 2 + n)));
    } catch (exc) {
      if (!(exc instanceof DeviceError)) throw exc; // another suite: skipped
    }
    at += 2 + n;
  }
  return out;
}

// QUIC variable-length integers (RFC 9000 §16), as binary HTTP uses them
function varint(n) {
  if (n < 64) return Uint8Array.of(n);
  if (n < 16384) return Uint8Array.of(0x40 | (n >> 8), n & 255);
  if (n < 2 ** 30) return Uint8Array.of(0x80 | (n >>> 24), (n >>> 16) & 255, (n >>> 8) & 255, n & 255);
  throw new DeviceError("binary HTTP: a length over 2^30 bytes");
}

function lengthPrefixed(bytes) {
  return concatBytes(varint(bytes.length), bytes);
}

function headerPairs(headers) {
  if (!headers) return [];
  if (typeof headers.forEach === "function" && !Array.isArray(headers)) {
    const out = [];
    headers.forEach((v, k) => out.push([k, v]));
    return out;
  }
  return Array.isArray(headers) ? headers : Object.entries(headers);
}

/**
 * A known-length binary HTTP request (RFC 9292 §3, framing indicator 0): method, scheme, authority, path, the
 * header fields (names lower-cased), the content and an empty trailer section, without padding.
 */
export function encodeBhttpRequest({ method = "GET", scheme, authority, path, headers = [], body = null }) {
  const fields = headerPairs(headers).map(([k, v]) => concatBytes(lengthPrefixed(textBytes(String(k).toLowerCase())),
    lengthPrefixed(textBytes(String(v)))));
  const content = body === null || body === undefined ? new Uint8Array(0)
    : typeof body === "string" ? textBytes(body) : new Uint8Array(body);
  return concatBytes(varint(0), lengthPrefixed(textBytes(method)), lengthPrefixed(textBytes(scheme)),
    lengthPrefixed(textBytes(authority)), lengthPrefixed(textBytes(path)), lengthPrefixed(concatBytes(...fields)),
    lengthPrefixed(content), varint(0));
}

/**
 * A known-length binary HTTP response (RFC 9292 §3, framing indicator 1) decoded: informational responses
 * skipped; resolves nothing, returns {status, headers: [[name, value], ...], body (Uint8Array)}. A message
 * truncated after its content (no trailer section) is accepted, as §3.8 allows; padding must be zeros.
 */
export function decodeBhttpResponse(data) {
  let at = 0;
  const fail = (what) => {
    throw new DeviceError(`binary HTTP response: ${what}`);
  };
  const readVarint = () => {
    if (at >= data.length) fail("truncated");
    const first = data[at];
    const size = 1 << (first >> 6);
    if (at + size > data.length) fail("truncated");
    let v = first & 0x3f;
    for (let i = 1; i < size; i++) v = v * 256 + data[at + i];
    at += size;
    return v;
  };
  const readBytes = () => {
    const n = readVarint();
    if (at + n > data.length) fail("truncated");
    at += n;
    return data.subarray(at - n, at);
  };
  const decoder = new TextDecoder("utf-8", { fatal: false });
  const readFields = () => {
    const section = readBytes();
    const saved = [data, at];
    data = section;
    at = 0;
    const out = [];
    while (at < data.length) out.push([decoder.decode(readBytes()), decoder.decode(readBytes())]);
    [data, at] = saved;
    return out;
  };
  if (readVarint() !== 1) fail("not a known-length response (framing indicator 1)");
  let status;
  for (;;) {
    status = readVarint();
    if (status < 100 || status > 599) fail(`status ${status}`);
    const headers = readFields();
    if (status >= 200) {
      const body = at < data.length ? Uint8Array.from(readBytes()) : new Uint8Array(0);
      if (at < data.length) readFields(); // trailers
      for (; at < data.length; at++) if (data[at] !== 0) fail("padding that is not zeros");
      return { status, headers, body };
    }
  }
}

/**
 * Encapsulate a binary HTTP request for a gateway (RFC 9458 §4.3): hdr = key id || kem || kdf || aead; info =
 * "message/bhttp request" 0x00 hdr; SetupBaseS; enc_request = hdr || enc || Seal("", request). Resolves to
 * {encRequest, open(encResponse) → the response's bytes (§4.4: secret = Export("message/bhttp response", 16);
 * prk = Extract(enc || response_nonce, secret); key, nonce = Expand(prk, "key"/"nonce"))}.
 * options.ephemeral: for test vectors only (hpkeSetupBaseS).
 */
export async function ohttpEncapsulate(keyConfig, request, { ephemeral } = {}) {
  const config = keyConfig && keyConfig.publicKey instanceof Uint8Array ? keyConfig : parseKeyConfig(keyConfig);
  const hdr = concatBytes(Uint8Array.of(config.keyId), uint16BE(OHTTP_KEM_ID), uint16BE(OHTTP_KDF_ID),
    uint16BE(OHTTP_AEAD_ID));
  const ctx = await hpkeSetupBaseS(config.publicKey, concatBytes(textBytes("message/bhttp request"),
    Uint8Array.of(0), hdr), { ephemeral });
  const ct = await ctx.seal(new Uint8Array(0), request);
  const secret = await ctx.export(textBytes("message/bhttp response"), OHTTP_RESPONSE_NONCE);
  const { enc } = ctx;
  return {
    encRequest: concatBytes(hdr, enc, ct),
    async open(encResponse) {
      const bytes = new Uint8Array(encResponse);
      if (bytes.length < OHTTP_RESPONSE_NONCE + 16) throw new DeviceError("OHTTP: the response is too short");
      const prk = await hkdfExtract(concatBytes(enc, bytes.subarray(0, OHTTP_RESPONSE_NONCE)), secret);
      const key = await hkdfExpand(prk, textBytes("key"), HPKE_NK);
      const nonce = await hkdfExpand(prk, textBytes("nonce"), HPKE_NN);
      return aesGcm("decrypt", key, nonce, new Uint8Array(0), bytes.subarray(OHTTP_RESPONSE_NONCE));
    },
  };
}

const NULL_BODY_STATUS = new Set([101, 103, 204, 205, 304]);

/**
 * A fetch-compatible function that sends every request through an Oblivious HTTP relay (spec v2 §4): the request
 * (method, URL, headers, body) is encoded as binary HTTP, encapsulated to the gateway's key config and POSTed to
 * `relayUrl` (the relay's POST /ohttp endpoint, e.g. "https://relay.example/ohttp"; the service's own "/ohttp" works
 * too, without hiding anything) as message/ohttp-req; the answer is opened and returned as a Response. The relay
 * sees the device's address but only ciphertext; the server sees the request but the relay's address. Use it as
 * the fetchFn of fetchToken, sendReport and for the head list: `fetchFn = ohttpFetch(relay, doc.ohttp_key)`.
 * keyConfig: the gateway's KeyConfig (bytes, or the head list's `ohttp_key`, b64url); the returned function's
 * `keyConfig` property is its b64url, for checkOhttpKey. Relative URLs are resolved against the page's location.
 * options.fetch: the outer fetch (default globalThis.fetch).
 */
export function ohttpFetch(relayUrl, keyConfig, { fetch: outerFetch = globalThis.fetch } = {}) {
  const config = parseKeyConfig(keyConfig);
  const fn = async (url, init = {}) => {
    const u = new URL(String(url), globalThis.location?.href);
    const request = encodeBhttpRequest({ method: (init.method ?? "GET").toUpperCase(), scheme: u.protocol.slice(0, -1),
      authority: u.host, path: `${u.pathname}${u.search}`, headers: init.headers, body: init.body ?? null });
    const { encRequest, open } = await ohttpEncapsulate(config, request);
    const outer = await outerFetch(relayUrl, { method: "POST", headers: { "Content-Type": "message/ohttp-req" },
      body: encRequest, credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer" });
    if (!outer.ok) {
      throw new DeviceError(`OHTTP relay ${relayUrl}: HTTP ${outer.status} (${(await outer.text()).slice(0, 200)})`);
    }
    const type = outer.headers.get("Content-Type") ?? "";
    if (!type.startsWith("message/ohttp-res")) {
      throw new DeviceError(`OHTTP relay ${relayUrl}: answered ${type || "no content type"}, not message/ohttp-res`);
    }
    const inner = decodeBhttpResponse(await open(await outer.arrayBuffer()));
    const headers = new Headers();
    for (const [k, v] of inner.headers) headers.append(k, v);
    return new Response(NULL_BODY_STATUS.has(inner.status) ? null : inner.body, { status: inner.status, headers });
  };
  fn.keyConfig = base64url(config.bytes);
  return fn;
}

/** The first usable KeyConfig of `GET {base}/ohttp-keys` (a relay's or the service's), as b64url. */
export async function fetchOhttpKeys(fetchFn, base) {
  let resp;
  try {
    resp = await fetchFn(`${String(base).replace(/\/+$/, "")}/ohttp-keys`, { ...QUIET });
  } catch (exc) {
    throw new DeviceError(`OHTTP keys: ${base} cannot be reached (${exc.message ?? exc})`);
  }
  if (!resp.ok) throw new DeviceError(`OHTTP keys: ${base}/ohttp-keys answered HTTP ${resp.status}`);
  const configs = parseOhttpKeys(new Uint8Array(await resp.arrayBuffer()));
  if (!configs.length) throw new DeviceError(`OHTTP keys: ${base}/ohttp-keys has no DHKEM(P-256) config`);
  return base64url(configs[0].bytes);
}

/**
 * Refuse (DeviceError) a relay path whose key config is not the head list's `ohttp_key` (spec v2 §4): a gateway key
 * of the server's choosing per device would let it tell devices apart. relayFetch: an ohttpFetch function.
 */
export function checkOhttpKey(doc, relayFetch) {
  const committed = doc?.ohttp_key;
  if (typeof committed !== "string") {
    throw new DeviceError("OHTTP: the head list names no gateway key (ohttp_key): this server runs no gateway");
  }
  if (committed.replace(/=+$/, "") !== relayFetch.keyConfig) {
    throw new DeviceError("OHTTP: the relay path's key config is not the one the head list commits to (ohttp_key); "
      + "nothing was sent");
  }
}
