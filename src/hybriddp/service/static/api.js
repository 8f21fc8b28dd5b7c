// Small helpers shared by the pages: JSON over fetch with the service's error messages, number formatting.

/** An HTTP or network failure, with the service's own message when it sent one. */
export class ApiError extends Error {
  constructor(message, status = 0) {
    super(message);
    this.name = "ApiError";
    this.status = status; // 0: the server could not be reached
  }
}

/** GET or POST JSON; throws ApiError naming the URL and the service's error message. */
export async function fetchJson(url, { method = "GET", body, keepalive = false } = {}) {
  let response;
  try {
    response = await fetch(url, {
      method,
      headers: body === undefined ? { Accept: "application/json" }
        : { Accept: "application/json", "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-cache",
      keepalive,
    });
  } catch (err) {
    throw new ApiError(`${method} ${url}: the server cannot be reached (${err.message})`);
  }
  if (response.headers.get("X-HybridDP-Offline") === "1") { // the service worker's kept copy (sw.js)
    throw new ApiError(`${method} ${url}: the server cannot be reached (this browser answered from its copy)`);
  }
  let doc = null;
  try {
    doc = await response.json();
  } catch {
    doc = null;
  }
  if (!response.ok) {
    const message = doc && doc.error && doc.error.message ? doc.error.message : response.statusText;
    throw new ApiError(`${method} ${url}: HTTP ${response.status}: ${message}`, response.status);
  }
  if (doc === null) throw new ApiError(`${method} ${url}: the answer is not JSON`, response.status);
  return doc;
}

/** A probability as a percentage with enough digits to tell small ones apart. */
export function percent(p, digits = 2) {
  if (p === null || p === undefined || !Number.isFinite(p)) return "–";
  const v = p * 100;
  if (v !== 0 && Math.abs(v) < 0.01) return `${v.toExponential(1)}%`;
  return `${v.toFixed(digits)}%`;
}

/** A count with thousands separators. */
export function count(n) {
  return Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "–";
}

/** A parameter value as the CLI prints it (%g-like). */
export function num(x) {
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  const a = Math.abs(x);
  return a !== 0 && (a < 1e-3 || a >= 1e6) ? x.toExponential(2).replace(/\.?0+e/, "e") : String(+x.toPrecision(4));
}

// Characters that change how text around them is shown without being visible themselves: C0/C1 controls, the
// bidirectional overrides, embeddings and isolates (U+202A–U+202E, U+2066–U+2069), the marks U+200E, U+200F,
// U+061C, and line/paragraph separators. A suggestion such as "gro\u202Eelgoog" would otherwise display reversed.
const INVISIBLE = /[\u0000-\u0008\u000B-\u001F\u007F-\u009F\u061C\u200E\u200F\u2028\u2029\u202A-\u202E\u2066-\u2069]/g;

/** ``s`` as shown on a page: every invisible control character (INVISIBLE) replaced by a visible ⟨U+XXXX⟩. */
export function shown(s) {
  return String(s).replace(INVISIBLE, (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`);
}

/** An element with attributes and children (strings become text nodes: nothing is parsed as HTML; text and titles
 * are shown with their control characters made visible, see shown). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = shown(v);
    else if (k === "title" || k === "aria-label") el.setAttribute(k, shown(v));
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(shown(c)));
  }
  return el;
}
