// The "contribute" switch: the picked record is randomized in this page by the device randomizer
// (/static/hybriddp-device.js, the same LocalAlg as hybriddp.device) and only the randomized report is sent.
//
// Where reports go: the newest BLENDER round still collecting reports (GET /api/v1/local-search/rounds,
// "contribute"); the round being searched has published its results and takes no more reports. With
// none open the switch stays disabled and says so.
//
// Admission (docs/TOKENS.md): the server takes a report only with a report token, an anonymous one-use token it
// blind-signed for an admitted device and that is bound to that one message. This browser's device credential
// (localStorage, CREDENTIAL_KEY) is the administrator's, or one the server gives its own pages when it runs with
// self-enrolment (demos); without one nothing is charged or sent. The token is got before the report is sent and
// kept with it, so a resent report is the same message with the same token (counted once). A server with open
// admission takes reports without tokens: the page then says that it is unsafe.

import { fetchJson, h, num } from "./api.js";

/** This browser's lifetime budget as a device (basic composition over the rounds it reports in). */
export const DEVICE_LIFETIME = { lifetimeEpsilon: 16, lifetimeDelta: 1e-4 };

/** Where this browser keeps its device credential: {"credential": "hdc_…", "id", "self_enrolled"} as JSON (a bare
 * credential string, e.g. one an administrator made and pasted here, is taken too). */
export const CREDENTIAL_KEY = "hybriddp-device-credential";

const ADMIN_ONLY = "this server admits only devices with a credential from its administrator";

/** Whether a failure to get a token may pass (the server unreachable or busy): the report is then kept. */
const passing = (err) => !err.status || err.status === 429 || err.status >= 500;

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
    this.pending = null; // a message charged and not yet acknowledged, with its token (resent as is: counted once)
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
    if (offline) {
      this.say("Offline: contributing needs the server; reload the page once it is back.", "muted");
      return;
    }
    if (!target) {
      this.say("No round is collecting reports right now, so there is nothing to contribute to.", "muted");
      return;
    }
    this.target = target;
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

  /** Whether a report can get a token (the server's admission is open, or this browser has a credential);
   * says why not otherwise. Asked before the ledger is charged. */
  async admitted() {
    const key = await this.loadTokenKey();
    if (key.admission === "open") return true;
    if (await this.credential()) return true;
    this.say(`Not sent: ${ADMIN_ONLY}, and this browser has none.`, "error");
    return false;
  }

  /** ``message`` with its report token, bound to it (obtainToken); as is if it has one or admission is open. */
  async withToken(message) {
    if (Object.hasOwn(message, "token")) return message;
    const roundId = this.target.id;
    const keyUrl = `/api/v1/rounds/${encodeURIComponent(roundId)}/token-key`;
    const fetchKeeping = async (url, init) => { // keeps the key document obtainToken used (its id, admission)
      const response = await fetch(url, init);
      if (url.endsWith(keyUrl) && response.ok) {
        const doc = await response.clone().json().catch(() => null);
        if (doc && typeof doc === "object") this.useTokenKey(doc);
      }
      return response;
    };
    const obtain = async () => {
      const open = (await this.loadTokenKey()).admission === "open";
      const credential = open ? null : await this.credential();
      if (!open && !credential) throw new Error(`${ADMIN_ONLY}, and this browser has none`);
      return this.device.obtainToken(fetchKeeping, "", roundId, credential, message);
    };
    try {
      return await obtain();
    } catch (err) {
      const kept = this.keptCredential();
      if (err.status !== 401 || !kept || !kept.self_enrolled) throw err;
      // the server no longer knows this browser's credential (its database was reset, or it was revoked):
      // a self-enrolled one is replaced once
      globalThis.localStorage.removeItem(CREDENTIAL_KEY);
      return obtain();
    }
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
      const earlier = this.pending;
      if (earlier) {
        await this.deliver(earlier); // an earlier report first: the ledger has charged it already
      }
      const picked = [[query, urlLevel ? url : null]];
      const roundId = this.target.id;
      // under a head list this browser already reported for, in a later round: the reports sent then go again,
      // uncharged, whatever is picked now (memoization, docs/ALGORITHM.md §15); otherwise a new charge
      const resend = this.ledger.canResend(hl.content_hash, roundId);
      try {
        if (!resend) this.ledger.check(hl.content_hash, Number(hl.epsilon), Number(hl.delta)); // before asking
      } catch (err) {
        if (err instanceof this.device.DeviceError) {
          this.say(earlier ? "Sent the report kept from your earlier pick (below); this pick is not sent: " +
            err.message : `Not sent: ${err.message}`, "muted");
          return null;
        }
        throw err;
      }
      if (!(await this.admitted())) return null;
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
      const sent = await this.deliver(message);
      if (resend) {
        this.say("Sent again, uncharged: the randomized report this browser made for this head list in an earlier " +
          "round (whatever you pick, the same report goes while the head list stays the same).", "");
      }
      return sent;
    } catch (err) {
      this.say(`${err.message}`, "error");
      return null;
    }
  }

  /** Get the charged ``message`` its token, keep it with the token (this.pending) and send it; resolves to the
   * message as sent. */
  async deliver(message) {
    let ready;
    try {
      ready = await this.withToken(message);
    } catch (err) {
      const again = passing(err);
      this.pending = again ? message : null; // charged either way; kept only if a token may still come
      this.show(message, again ? "not sent yet: it has no token" : "not sent");
      throw new Error(again ? `No report token yet: ${err.message}. The report is kept and sent with a token with ` +
        "your next pick." : `Not sent: ${err.message}`, { cause: err });
    }
    this.pending = ready;
    await this.send(ready);
    return ready;
  }

  async send(message) {
    const url = `/api/v1/rounds/${encodeURIComponent(this.target.id)}/reports`;
    this.show(message, "sending…");
    let ack;
    try {
      ack = await fetchJson(url, { method: "POST", body: message, keepalive: true });
    } catch (err) {
      this.show(message, "not acknowledged yet");
      throw new Error(`${err.message}. The report is kept and sent again (same id, same token: counted once) ` +
        "with your next pick.");
    }
    this.pending = null;
    this.show(message, ack.counted === 1 ? "acknowledged and counted" : "acknowledged (already counted)");
    this.say("Sent: the randomized report below, never what you picked.", "");
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
