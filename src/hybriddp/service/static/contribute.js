// The "contribute" switch: the picked record is randomized in this page by the device randomizer
// (/static/hybriddp-device.js, the same LocalAlg as hybriddp.device) and only the randomized report is sent.
//
// Where reports go: the newest BLENDER round still collecting reports (GET /api/v1/local-search/rounds,
// "contribute"); the round being searched has published its results and takes no more reports. With
// none open the switch stays disabled and says so.

import { fetchJson, h, num } from "./api.js";

/** This browser's lifetime budget as a device (basic composition over the rounds it reports in). */
export const DEVICE_LIFETIME = { lifetimeEpsilon: 16, lifetimeDelta: 1e-4 };

export class Contribute {
  constructor() {
    this.button = document.getElementById("contribute");
    this.status = document.getElementById("contribute-status");
    this.sent = document.getElementById("sent");
    this.sentMessage = document.getElementById("sent-message");
    this.sentFacts = document.getElementById("sent-facts");
    this.spent = document.getElementById("spent");
    this.device = null;
    this.ledger = null;
    this.target = null;
    this.headList = null;
    this.pending = null; // a message charged and not yet acknowledged (resent with the same id: counted once)
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

  /** The user picked ``query`` (and ``url``, the URL they chose or the query's top one): report it if on. */
  async picked(query, url) {
    if (!this.on || !this.target) return null;
    try {
      const hl = await this.loadHeadList();
      const urlLevel = hl.url_level !== false;
      if (urlLevel && !url) {
        this.say("This suggestion has no URL, and the round collects (query, URL) pairs: nothing sent.", "muted");
        return null;
      }
      if (this.pending) {
        await this.send(this.pending); // an earlier report first: the ledger has charged it already
      }
      let message;
      try {
        message = await this.device.randomizeRecords(hl, [[query, urlLevel ? url : null]], { ledger: this.ledger });
      } catch (err) {
        if (err instanceof this.device.DeviceError) {
          this.say(`Not sent: ${err.message}`, "muted");
          return null;
        }
        throw err;
      }
      this.pending = message;
      this.showSpent();
      await this.send(message);
      return message;
    } catch (err) {
      this.say(`${err.message}`, "error");
      return null;
    }
  }

  async send(message) {
    const url = `/api/v1/rounds/${encodeURIComponent(this.target.id)}/reports`;
    this.show(message, "sending…");
    let ack;
    try {
      ack = await fetchJson(url, { method: "POST", body: message, keepalive: true });
    } catch (err) {
      this.show(message, "not acknowledged yet");
      throw new Error(`${err.message}. The report is kept and sent again (same id, counted once) ` +
        "with your next pick.");
    }
    this.pending = null;
    this.show(message, ack.counted === 1 ? "acknowledged and counted" : "acknowledged (already counted)");
    this.say("Sent: the randomized report below, never what you picked.", "");
    return ack;
  }

  show(message, state) {
    this.sent.hidden = false;
    this.sentMessage.textContent = JSON.stringify(message, null, 2);
    this.sentFacts.replaceChildren(
      h("dt", {}, "Reported"),
      h("dd", {}, message.reports.map((r) => `⟨${r.query ?? "*"}, ${r.url ?? "*"}⟩`).join(", ")
        || "nothing (no record sampled)"),
      h("dt", {}, "Report id"), h("dd", { class: "mono" }, message.id),
      h("dt", {}, "Head list"), h("dd", { class: "mono" }, message.headlist),
      h("dt", {}, "Server"), h("dd", { id: "sent-state" }, state),
    );
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
