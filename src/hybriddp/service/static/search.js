// The local-search page: the published local-search document, kept in this browser, searched as you type.

import { ApiError, fetchJson, h, percent, shown } from "./api.js";
import { Contribute } from "./contribute.js";
import { isLocalSearchDoc, keep, loadKept } from "./keep.js";
import { buildIndex, normalize, suggest } from "./suggest.js";

const LIMIT = 8;

const input = document.getElementById("q");
const listbox = document.getElementById("suggestions");
const listStatus = document.getElementById("list-status");
const netStatus = document.getElementById("net-status");
const countStatus = document.getElementById("suggest-count");
const pickedPanel = document.getElementById("picked");
const roundLink = document.getElementById("round-link");
const contribute = new Contribute();

let doc = null;
let index = [];
let matches = [];
let active = -1;

// Only web addresses become links: a URL in the published list came from users' records, and a
// "javascript:" or "data:" one must never be clickable (the page's CSP would block it too).
function linkTag(url) {
  return /^https?:\/\//i.test(url) ? "a" : "span";
}

function host(url) {
  try {
    const u = new URL(url);
    return u.host + (u.pathname === "/" ? "" : u.pathname);
  } catch {
    return url;
  }
}

function queryLabel(m) {
  // underline the typed part where the normalized query lines up with the shown one
  if (m.query.toLowerCase() !== m.norm) return [m.query];
  return [m.query.slice(0, m.at), h("mark", {}, m.query.slice(m.at, m.at + m.length)), m.query.slice(m.at + m.length)];
}

function option(m, i) {
  const urls = m.urls.slice(0, 3).map((u) => h(linkTag(u.url), {
    href: u.url, tabindex: "-1", target: "_blank", rel: "noopener noreferrer", "data-url": u.url,
    title: `${u.url} (${percent(u.p)})`,
  }, host(u.url)));
  return h("li", { role: "option", id: `opt-${i}`, "aria-selected": "false", "data-query": m.query },
    h("span", { class: "q" }, ...queryLabel(m)),
    h("span", { class: "p", title: "blended probability" }, percent(m.p)),
    urls.length ? h("span", { class: "urls" }, urls) : null);
}

function setActive(i) {
  const items = listbox.children;
  if (active >= 0 && items[active]) items[active].setAttribute("aria-selected", "false");
  active = i;
  if (active >= 0 && items[active]) {
    items[active].setAttribute("aria-selected", "true");
    items[active].scrollIntoView({ block: "nearest" });
    input.setAttribute("aria-activedescendant", items[active].id);
  } else {
    input.removeAttribute("aria-activedescendant");
  }
}

/** Redraw the suggestions for the box's text (synchronously, from memory: no network). */
function update() {
  matches = doc ? suggest(index, input.value, LIMIT) : [];
  active = -1;
  input.removeAttribute("aria-activedescendant");
  listbox.replaceChildren(...matches.map(option));
  const t = input.value.trim();
  countStatus.textContent = !t ? "" : matches.length === 0 ? "No suggestions"
    : `${matches.length} suggestion${matches.length === 1 ? "" : "s"}`;
}

function close() {
  matches = [];
  setActive(-1);
  listbox.replaceChildren();
}

function pick(m, url = null) {
  const chosen = url ?? (m.urls.length ? m.urls[0].url : null);
  input.value = m.query;
  close();
  document.getElementById("picked-query").textContent = shown(m.query);
  document.getElementById("picked-urls").replaceChildren(...(m.urls.length
    ? m.urls.map((u) => h("li", {}, h(linkTag(u.url), { href: u.url, target: "_blank", rel: "noopener noreferrer" }, u.url),
      " ", h("span", { class: "muted small" }, percent(u.p))))
    : [h("li", { class: "muted" }, "no URL listed for this query")]));
  pickedPanel.hidden = false;
  contribute.picked(m.query, chosen);
}

input.addEventListener("input", update);

input.addEventListener("keydown", (ev) => {
  const n = matches.length;
  if (ev.key === "ArrowDown") {
    ev.preventDefault();
    if (n === 0) update();
    if (matches.length) setActive(active + 1 >= matches.length ? 0 : active + 1);
  } else if (ev.key === "ArrowUp") {
    ev.preventDefault();
    if (n) setActive(active <= 0 ? n - 1 : active - 1);
  } else if (ev.key === "Enter") {
    if (active >= 0 && active < n) {
      ev.preventDefault();
      pick(matches[active]);
    } else if (n && matches[0].norm === normalize(input.value)) {
      ev.preventDefault();
      pick(matches[0]); // the whole query typed out
    }
  } else if (ev.key === "Escape") {
    if (n) {
      ev.preventDefault();
      close();
    }
  }
});

listbox.addEventListener("mousedown", (ev) => {
  if (ev.target.closest("a")) return; // a link: the click handler below
  ev.preventDefault(); // keep focus in the box
  const li = ev.target.closest('li[role="option"]');
  if (li) pick(matches[Array.prototype.indexOf.call(listbox.children, li)]);
});

listbox.addEventListener("click", (ev) => {
  const a = ev.target.closest("a[data-url]");
  const li = ev.target.closest('li[role="option"]');
  if (a && li) {
    // the link opens (in a new tab) as usual; picking redraws the list, so it waits until the click is handled
    const m = matches[Array.prototype.indexOf.call(listbox.children, li)];
    setTimeout(() => pick(m, a.dataset.url), 0);
  }
});

listbox.addEventListener("mousemove", (ev) => {
  const li = ev.target.closest('li[role="option"]');
  if (li) {
    const i = Array.prototype.indexOf.call(listbox.children, li);
    if (i !== active) setActive(i);
  }
});

function use(newDoc, how) {
  doc = newDoc;
  index = buildIndex(doc);
  input.disabled = false;
  input.placeholder = `Search ${doc.queries.length} popular ${doc.queries.length === 1 ? "query" : "queries"}`;
  const n = doc.queries.length;
  listStatus.textContent = `${n} ${n === 1 ? "query" : "queries"} from round ${doc.round}, ${how}`;
  roundLink.href = `/rounds/${encodeURIComponent(doc.round)}`;
  roundLink.hidden = false;
  document.body.dataset.ready = "true";
  if (input.value) update();
}

let netAsked = 0; // the latest network check: an earlier answer that arrives after it is not shown

function online(ok, why = "") {
  netStatus.replaceChildren(ok ? h("span", { class: "badge ok" }, "online")
    : h("span", { class: "badge warn", title: why }, "offline: searching the kept list"));
}

// the badge follows the browser's network events, not only the page's load: `offline` shows at once (requests
// would fail); `online` asks the server first, since a network that came back may still not reach it
window.addEventListener("offline", () => {
  netAsked++;
  online(false, "this browser reports no network");
});
window.addEventListener("online", async () => {
  const asked = ++netAsked;
  try {
    await fetchJson("/api/v1/local-search/rounds");
    if (asked === netAsked) online(true);
  } catch (err) {
    if (asked === netAsked) online(false, err.message);
  }
});

async function start() {
  const wanted = new URLSearchParams(location.search).get("round");
  const kept = loadKept();
  if (kept && (!wanted || kept.doc.round === wanted)) {
    use(kept.doc, `kept in this browser since ${new Date(kept.saved).toLocaleString()}`);
  }
  let rounds = null;
  const asked = ++netAsked;
  try {
    rounds = await fetchJson("/api/v1/local-search/rounds");
    if (asked === netAsked) online(true);
  } catch (err) {
    if (asked === netAsked) online(false, err.message);
  }
  const target = wanted ?? (rounds && rounds.search ? rounds.search.id : null);
  if (target && (!doc || doc.round !== target)) {
    try {
      const fresh = await fetchJson(`/api/v1/rounds/${encodeURIComponent(target)}/local-search`);
      if (!isLocalSearchDoc(fresh)) throw new ApiError(`round ${target}: the local-search document is malformed`);
      use(fresh, keep(fresh) ? "downloaded and kept in this browser" : "downloaded (this browser refused to keep it)");
    } catch (err) {
      if (!doc) listStatus.replaceChildren(h("span", { class: "error" }, err.message));
    }
  } else if (!doc && rounds) {
    listStatus.textContent = "No round has published results yet: once an administrator closes a BLENDER round, " +
      "its suggestions appear here.";
  } else if (!doc) {
    listStatus.textContent = "The server cannot be reached and no list is kept in this browser yet.";
  }
  document.body.dataset.loaded = "true";
  await contribute.init(rounds ? rounds.contribute : null, rounds === null);
  document.body.dataset.contributeReady = "true";
}

// the page itself opens offline too (sw.js); where service workers are unavailable (a plain-http address
// other than localhost) the kept document still serves the page once it is loaded
if ("serviceWorker" in navigator) {
  navigator.serviceWorker.register("/sw.js").catch(() => {});
}
start();
