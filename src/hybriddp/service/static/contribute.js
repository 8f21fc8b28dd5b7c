// The "contribute" switch: the picked record is randomized in this page by the device randomizer
// (/static/hybriddp-device.js, the same LocalAlg as hybriddp.device) and only the randomized report is sent.
//
// Where reports go: the newest BLENDER round still collecting reports (GET /api/v1/local-search/rounds,
// "contribute"); the round being searched has published its results and takes no more reports. With
// none open the switch stays disabled and says so.
//
// Admission and timing (docs/TOKENS.md, protocol v2): the server takes a report only with a report token, an anonymous
// one-use token it blind-signed for an admitted device. This browser's device credential (localStorage,
// CREDENTIAL_KEY) is the administrator's, or one the server gives its own pages when it runs with self-enrolment
// (demos); without one nothing is charged or sent. The token is got when the switch is turned on and the round's
// head list downloaded, on a request of its own, before anything is picked (TOKENS_KEY keeps it until it is spent);
// its key must be the one the head list commits to. A pick is randomized, charged, given the token and the id the
// token's nonce derives, and kept in the outbox (OUTBOX_KEY, localStorage) with its send time: uniform in the
// round's report window (reportTime), so the server cannot match the report to the token request by time. The page
// sends it then with a timer while it is open; if the page was closed, the next load sends what is due at once (a
// report past its time goes late rather than never). A report whose POST failed stays in the outbox and goes again,
// the same message with the same token (counted once), with the next pick or load. A server with open admission
// takes reports without tokens: the page then says that it is unsafe.
//
// For tests only: localStorage REPORT_NOW_KEY = "1" sends at once (reportNow), which gives up unlinkability.

import { fetchJson, h, num } from "./api.js";

/** This browser's lifetime budget as a device (basic composition over the rounds it reports in). */
export const DEVICE_LIFETIME = { lifetimeEpsilon: 16, lifetimeDelta: 1e-4 };

/** Where this browser keeps its device credential: {"credential": "hdc_…", "id", "self_enrolled"} as JSON (a bare
 * credential string, e.g. one an administrator made and pasted here, is taken too). */
export const CREDENTIAL_KEY = "hybriddp-device-credential";

/** Report tokens got ahead, not yet spent: {round id: {token, messageId}} as JSON. */
export const TOKENS_KEY = "hybriddp-report-tokens";
/** Charged messages not yet acknowledged: {round id: {message, send_at (unix seconds)}} as JSON. */
export const OUTBOX_KEY = "hybriddp-outbox";
/** "1": send at once instead of at a random time in the report window. For tests only. */
export const REPORT_NOW_KEY = "hybriddp-report-now";

const ADMIN_ONLY = "this server admits only devices with a credential from its administrator";

function readMap(key) {
  try {
    const doc = JSON.parse(globalThis.localStorage.getItem(key) ?? "{}");
    return doc && typeof doc === "object" && !Array.isArray(doc) ? doc : {};
  } catch {
    return {};
  }
}

/** Set (or with value null delete) one round's entry of a kept map; throws if the browser refuses to keep it. */
function writeEntry(key, roundId, value) {
  const doc = readMap(key);
  if (value === null) delete doc[roundId];
  else doc[roundId] = value;
  globalThis.localStorage.setItem(key, JSON.stringify(doc));
}

const clock = (seconds) => new Date(seconds * 1000).toISOString().slice(11, 19) + " UTC";


export class Contribute {
  constructor() {
    this.button = document.getElementById("contribute");
    this.status = document.getElementById("contribute-status");
    this.sent = document.getElementById("sent");
    this.sentMessage = document.getElementById("sent-message");
    this.sentFacts = document.getElementById("sent-facts");
    this.spent = document.getElementById("spent");
    this.warning = document.getElementById("admission-warning");
    this.device = null;
    this.ledger = null;
    this.target = null;
    this.headList = null;
    this.timers = new Map(); // round id → the timer that sends its outbox entry
    this.pendingTicket = null; // the token being fetched
    this.notes = new Map(); // round id → what the page says once its kept message is acknowledged
    this.tokenKey = null; // the round's token-key document: its admission mode and key id
    this.enrolment = null; // false once the server said it gives no credentials (no self-enrolment)
    this.queue = Promise.resolve(); // picks are handled one after the other
    this.button.addEventListener("click", () => this.toggle());
  }

  get on() {
    return this.button.getAttribute("aria-checked") === "true";
  }

  say(text, kind = "") {
    this.status.textContent = text;
    this.status.className = `small ${kind}`;
  }

  /** Load the randomizer and the device ledger; ``target`` is the round taking reports, or null. */
  async init(target, offline = false) {
    try {
      this.device = await import("./hybriddp-device.js");
      this.ledger = new this.device.DeviceLedger(globalThis.localStorage, DEVICE_LIFETIME);
    } catch (err) {
      this.say(`Contributing is unavailable: the randomizer could not be loaded (${err.message}).`, "error");
      return;
    }
    this.showSpent();
    if (!offline) this.resumeOutbox();
    if (offline) {
      this.say("Offline: contributing needs the server; reload the page once it is back.", "muted");
      return;
    }
    if (!target) {
      this.say("No round is collecting reports right now, so there is nothing to contribute to.", "muted");
      return;
    }
    this.target = target;
    try {
      for (const roundId of Object.keys(readMap(TOKENS_KEY))) { // tokens of rounds no longer taking reports: unusable
        if (roundId !== target.id) writeEntry(TOKENS_KEY, roundId, null);
      }
    } catch {
      // the browser keeps nothing: nothing to drop
    }
    this.button.disabled = false;
    this.say(`Reports go to round “${target.name || target.id}”, which is collecting them.`, "muted");
    try {
      await this.loadTokenKey(); // shows the warning of a server with open admission before anything is picked
    } catch {
      // asked again when a report is sent, which then says what went wrong
    }
  }

  async toggle() {
    const on = !this.on;
    this.button.setAttribute("aria-checked", String(on));
    if (!on) {
      this.say("Off: nothing you pick is sent.", "muted");
      return;
    }
    this.say("On: the next suggestion you pick is randomized here and its report sent.", "");
    try {
      await this.loadHeadList();
    } catch (err) {
      this.say(err.message, "error");
      return;
    }
    try {
      await this.ticket(); // the token, got now on its own request, before anything is picked
    } catch {
      // asked again when something is picked, which then says what went wrong
    }
  }

  /** The round's head list, fetched once and checked (format, privacy fields, content hash) by the randomizer. */
  async loadHeadList() {
    if (this.headList) return this.headList;
    const url = `/api/v1/rounds/${encodeURIComponent(this.target.id)}/headlist`;
    const doc = await this.device.validateHeadList(await fetchJson(url));
    if (this.target.headlist_hash && doc.content_hash !== this.target.headlist_hash) {
      throw new Error(`the head list served for round ${this.target.id} has hash ${doc.content_hash}, but the round ` +
        `published ${this.target.headlist_hash}; not reporting`);
    }
    this.headList = doc;
    return doc;
  }

  /** The round's token-key document (GET /api/v1/rounds/{id}/token-key): its key id and admission mode. */
  async loadTokenKey() {
    if (this.tokenKey) return this.tokenKey;
    this.useTokenKey(await fetchJson(`/api/v1/rounds/${encodeURIComponent(this.target.id)}/token-key`));
    return this.tokenKey;
  }

  useTokenKey(doc) {
    this.tokenKey = doc;
    if (this.warning) this.warning.hidden = doc.admission !== "open";
  }

  /** This browser's kept credential {credential, self_enrolled}, or null. */
  keptCredential() {
    let raw;
    try {
      raw = globalThis.localStorage.getItem(CREDENTIAL_KEY);
    } catch {
      return null;
    }
    if (!raw || !raw.trim()) return null;
    let doc;
    try {
      doc = JSON.parse(raw);
    } catch {
      doc = raw; // a bare credential
    }
    if (typeof doc === "string") return doc.trim() ? { credential: doc.trim(), self_enrolled: false } : null;
    return doc && typeof doc.credential === "string" && doc.credential ? doc : null;
  }

  /** This browser's device credential: the kept one, else one the server gives its own pages (self-enrolment,
   * asked once and kept); null if the server gives none. */
  async credential() {
    const kept = this.keptCredential();
    if (kept) return kept.credential;
    if (this.enrolment === false) return null;
    let made;
    try {
      made = await fetchJson("/api/v1/device-credentials/self", { method: "POST" });
    } catch (err) {
      if (err.status === 404) {
        this.enrolment = false;
        return null;
      }
      throw new Error(`This browser could not get a device credential: ${err.message}`, { cause: err });
    }
    if (typeof made.credential !== "string" || !made.credential) {
      throw new Error("This browser could not get a device credential: the server's answer has none.");
    }
    try {
      globalThis.localStorage.setItem(CREDENTIAL_KEY, JSON.stringify({ credential: made.credential, id: made.id,
        tokens_per_round: made.tokens_per_round, self_enrolled: true }));
    } catch (err) {
      throw new Error(`This browser cannot keep its device credential (${err.message}); not reporting.`);
    }
    return made.credential;
  }

  /** This round's report token got ahead ({token, messageId}, kept in localStorage until spent), fetched now if
   * there is none; {token: null, messageId} under open admission; null when this browser has no credential. The
   * token's key is checked against the head list's commitment (fetchToken). */
  ticket() {
    if (!this.pendingTicket) this.pendingTicket = this.getTicket().finally(() => { this.pendingTicket = null; });
    return this.pendingTicket; // one request at a time: switching on and a quick pick share it
  }

  async getTicket() {
    const roundId = this.target.id;
    const kept = readMap(TOKENS_KEY)[roundId];
    if (kept && typeof kept.token === "string") return kept;
    if ((await this.loadTokenKey()).admission === "open") {
      return { token: null, messageId: this.device.newMessageId() };
    }
    const hl = await this.loadHeadList();
    const fetchOnce = async () => {
      const credential = await this.credential();
      if (!credential) return null;
      return this.device.fetchToken((url, init) => fetch(url, init), "", roundId, credential, hl);
    };
    let got;
    try {
      got = await fetchOnce();
    } catch (err) {
      const self = this.keptCredential();
      if (err.status !== 401 || !self || !self.self_enrolled) throw err;
      // the server no longer knows this browser's credential (its database was reset, or it was revoked):
      // a self-enrolled one is replaced once
      globalThis.localStorage.removeItem(CREDENTIAL_KEY);
      got = await fetchOnce();
    }
    if (got === null) return null;
    const ticket = { token: got.token, messageId: got.messageId };
    writeEntry(TOKENS_KEY, roundId, ticket);
    return ticket;
  }

  /** The user picked ``query`` (and ``url``, the URL they chose or the query's top one): report it if on. */
  picked(query, url) {
    const done = this.queue.then(() => this.pick(query, url));
    this.queue = done.catch(() => null);
    return done;
  }

  async pick(query, url) {
    if (!this.on || !this.target) return null;
    try {
      const hl = await this.loadHeadList();
      const urlLevel = hl.url_level !== false;
      if (urlLevel && !url) {
        this.say("This suggestion has no URL, and the round collects (query, URL) pairs: nothing sent.", "muted");
        return null;
      }
      const roundId = this.target.id;
      const waiting = readMap(OUTBOX_KEY)[roundId];
      let earlier = false;
      if (waiting && waiting.send_at <= Date.now() / 1000) { // due and not acknowledged (its POST failed): again
        earlier = true;
        await this.sendKept(roundId);
      }
      const picked = [[query, urlLevel ? url : null]];
      // under a head list this browser already reported for, in a later round: the reports sent then go again,
      // uncharged, whatever is picked now (memoization, docs/ALGORITHM.md §15); otherwise a new charge. The ledger
      // is keyed by the lists hash (the head list without its round's key and window), as randomizeRecords keys it
      const lists = await this.device.listsHash(hl);
      const resend = this.ledger.canResend(lists, roundId);
      try {
        if (!resend) this.ledger.check(lists, Number(hl.epsilon), Number(hl.delta)); // before asking
      } catch (err) {
        if (err instanceof this.device.DeviceError) {
          this.say(earlier ? "Sent the report kept from your earlier pick (below); this pick is not sent: " +
            err.message : `Not sent: ${err.message}`, "muted");
          return null;
        }
        throw err;
      }
      let ticket;
      try {
        ticket = await this.ticket();
      } catch (err) {
        this.say(`Not sent, nothing charged: no report token (${err.message}).`, "error");
        return null;
      }
      if (ticket === null) {
        this.say(`Not sent: ${ADMIN_ONLY}, and this browser has none.`, "error");
        return null;
      }
      let message;
      try {
        message = await this.device.randomizeRecords(hl, picked, { ledger: this.ledger, roundId });
      } catch (err) {
        if (err instanceof this.device.DeviceError) {
          this.say(`Not sent: ${err.message}`, "muted");
          return null;
        }
        throw err;
      }
      this.showSpent();
      message = this.device.attachToken(message, ticket); // the id the token's nonce gives, and the token
      const reportNow = globalThis.localStorage.getItem(REPORT_NOW_KEY) === "1";
      const entry = this.device.outboxEntry(message, hl, { reportNow });
      writeEntry(OUTBOX_KEY, roundId, entry); // kept before anything is sent; the token is spent by it
      writeEntry(TOKENS_KEY, roundId, null);
      const note = resend ? " It is the randomized report this browser made for this head list in an earlier round, " +
        "sent again uncharged (whatever you pick, the same report goes while the head list stays the same)." : "";
      if (resend) this.notes.set(roundId, "Sent again, uncharged: the randomized report this browser made for this " +
        "head list in an earlier round (whatever you pick, the same report goes while the head list stays the same).");
      if (entry.send_at > Date.now() / 1000) {
        this.show(message, `waiting: sent at ${clock(entry.send_at)}`);
        this.say(`Randomized and kept: it is sent at ${clock(entry.send_at)}, a random time in the round's report ` +
          "window, so the server cannot tell it from the token request by its time. If this page is closed, it " +
          `is sent when the page is opened again.${note}`, "");
      }
      this.schedule(roundId, entry.send_at);
      return message;
    } catch (err) {
      this.say(`${err.message}`, "error");
      return null;
    }
  }

  /** Send every kept message of the outbox when it is due: now for what is overdue (the page was closed). */
  resumeOutbox() {
    for (const [roundId, entry] of Object.entries(readMap(OUTBOX_KEY))) {
      if (entry && entry.message && typeof entry.send_at === "number") this.schedule(roundId, entry.send_at);
    }
  }

  schedule(roundId, sendAt) {
    clearTimeout(this.timers.get(roundId));
    const delay = Math.max(0, sendAt * 1000 - Date.now());
    this.timers.set(roundId, setTimeout(() => {
      this.timers.delete(roundId);
      this.queue = this.queue.then(() => this.sendKept(roundId)).catch((err) => this.say(err.message, "error"));
    }, Math.min(delay, 2 ** 31 - 1)));
  }

  /** POST the outbox's message of ``roundId`` (the same message and token every time: counted once); on an
   * acknowledgement it leaves the outbox. */
  async sendKept(roundId) {
    const entry = readMap(OUTBOX_KEY)[roundId];
    if (!entry || !entry.message) return null;
    const { message } = entry;
    this.show(message, "sending…");
    let ack;
    try {
      ack = await this.device.sendReport((url, init) => fetch(url, { ...init, keepalive: true }), "", roundId,
        message);
    } catch (err) {
      this.show(message, "not acknowledged yet");
      if (err.status === 409 && err.code === "too_few_tokens" && err.retryAfter) {
        this.schedule(roundId, Date.now() / 1000 + err.retryAfter);
      } else if (err.status && err.status !== 429 && err.status < 500) {
        writeEntry(OUTBOX_KEY, roundId, null); // refused for good: sending it again cannot help
        this.say(`Not sent: ${err.message}`, "error");
        return null;
      }
      throw new Error(`${err.message}. The report is kept and sent again (same id, same token: counted once) ` +
        "with your next pick or when this page is opened again.");
    }
    writeEntry(OUTBOX_KEY, roundId, null);
    this.show(message, ack.counted === 1 ? "acknowledged and counted" : "acknowledged (already counted)");
    this.say(this.notes.get(roundId) ?? "Sent: the randomized report below, never what you picked.", "");
    this.notes.delete(roundId);
    return ack;
  }

  show(message, state) {
    this.sent.hidden = false;
    const token = message.token; // shortened on the page: it is a bearer of this one report, not for copying
    const visible = typeof token === "string"
      ? { ...message, token: `${token.slice(0, 8)}… (${token.length} characters, shortened here)` } : message;
    this.sentMessage.textContent = JSON.stringify(visible, null, 2);
    this.sentFacts.replaceChildren(
      h("dt", {}, "Reported"),
      h("dd", {}, message.reports.map((r) => `⟨${r.query ?? "*"}, ${r.url ?? "*"}⟩`).join(", ")
        || "nothing (no record sampled)"),
      h("dt", {}, "Report id"), h("dd", { class: "mono" }, message.id),
      h("dt", {}, "Head list"), h("dd", { class: "mono" }, message.headlist),
      h("dt", {}, "Token"), h("dd", { id: "sent-token" }, this.tokenFact(message)),
      h("dt", {}, "Server"), h("dd", { id: "sent-state" }, state),
    );
  }

  tokenFact(message) {
    if (typeof message.token === "string") {
      const keyId = this.tokenKey && typeof this.tokenKey.key_id === "string" ? this.tokenKey.key_id : "";
      return `anonymous, one-use (key id ${keyId.slice(0, 12)}…)`;
    }
    if (this.tokenKey && this.tokenKey.admission === "open") return "none: this server runs with open admission";
    return "none: the server has issued none for it";
  }

  showSpent() {
    if (!this.ledger) return;
    const spent = this.ledger.spent();
    this.spent.replaceChildren(
      h("dt", {}, "Privacy spent by this device"),
      h("dd", { id: "spent-value" },
        `ε = ${num(spent.epsilon)} of ${num(DEVICE_LIFETIME.lifetimeEpsilon)}, ` +
        `δ = ${num(spent.delta)} of ${num(DEVICE_LIFETIME.lifetimeDelta)}`),
    );
  }
}
