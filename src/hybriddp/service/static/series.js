// The series page: schedule, budget, each period's round, and the queries that rose or fell, a chart each.

import { count, fetchJson, h, shown } from "./api.js";
import { trendChart } from "./chart.js";

const $ = (id) => document.getElementById(id);
const seriesId = decodeURIComponent(location.pathname.replace(/\/+$/, "").split("/").pop());
const api = `/api/v1/series/${encodeURIComponent(seriesId)}`;

function duration(seconds) {
  for (const [unit, size] of [["week", 604800], ["day", 86400], ["hour", 3600], ["minute", 60]]) {
    if (seconds >= size && seconds % size === 0) {
      const n = seconds / size;
      return `${n} ${unit}${n === 1 ? "" : "s"}`;
    }
  }
  return `${seconds} seconds`;
}

function renderSummary(doc) {
  document.title = `${doc.name || doc.id} · series · hybriddp`;
  $("series-name").textContent = shown(doc.name || `Series ${doc.id}`);
  $("series-state").replaceChildren(h("span", { class: `badge ${doc.state === "active" ? "ok" : ""}` }, doc.state));
  $("series-id").textContent = `${doc.kind} series ${doc.id}`;
  const now = doc.current_period ? `; now in period ${doc.current_period}` : "";
  $("schedule").textContent = `${doc.periods} periods of ${duration(doc.period_seconds)} from `
    + `${new Date(doc.start).toLocaleString()}; each takes opt-in data for its first `
    + `${duration(doc.optin_seconds)}, then devices report until it ends${now}.`
    + (doc.kind === "blender" && doc.carry > 0 ? ` A record a period's head list selects stays listed for the `
      + `next ${doc.carry} period${doc.carry === 1 ? "" : "s"}, so a query that falls can still be measured.` : "");
  const b = doc.budget;
  if (b) {
    $("budget").textContent = `Each period charges its opt-in users ε = ${b.round_epsilon}, δ = ${b.round_delta}; `
      + `the lifetime budget (ε = ${b.lifetime_epsilon}, δ = ${b.lifetime_delta}) lets a user take part in `
      + `${b.periods_per_user} period${b.periods_per_user === 1 ? "" : "s"}`
      + (b.composition === "pld" ? ` by privacy-loss-distribution accounting (${b.periods_per_user_basic} by basic `
        + "composition)." : " (basic composition).");
  }
  $("summary").hidden = false;
}

function renderPeriods(doc) {
  const rows = doc.periods_table.map((p) => {
    const r = p.round;
    const link = r ? h("a", { href: `/rounds/${encodeURIComponent(r.id)}`, class: "mono" }, r.id.slice(0, 8)) : "";
    return h("tr", {}, h("td", {}, String(p.period)), h("td", {}, new Date(p.starts).toLocaleString()),
      h("td", {}, new Date(p.ends).toLocaleString()), h("td", {}, link), h("td", {}, r ? r.state : ""),
      h("td", { class: "num" }, r ? count(r.reports) : ""), h("td", { class: "small" }, p.note || ""));
  });
  const head = h("tr", {}, ...["period", "starts", "ends", "round", "state", "reports", ""].map((c) => h("th", {}, c)));
  $("periods").replaceChildren(h("table", { class: "results" }, h("thead", {}, head), h("tbody", {}, ...rows)));
  $("periods-panel").hidden = false;
}

let trendsAsked = 0; // the latest trend request: an earlier answer that arrives after it is not shown
let windowChosen = false; // until the reader picks a window, the page asks for the server's default and shows it

/** Select `value` in the window menu (adding it when the menu lacks it): the window the shown trends used. */
function showWindow(value) {
  const select = $("window");
  const text = String(value);
  if (![...select.options].some((o) => o.value === text)) {
    select.append(h("option", {}, text));
  }
  select.value = text;
}

async function renderTrends() {
  // no window asked: the API's default (the one the CLI and the SDK use), shown in the menu once answered
  const query = windowChosen ? `?window=${encodeURIComponent($("window").value)}` : "";
  const asked = ++trendsAsked;
  $("trends-summary").textContent = "Testing…";
  let doc;
  try {
    doc = await fetchJson(`${api}/trends${query}`);
  } catch (err) {
    if (asked === trendsAsked) $("trends-summary").textContent = err.message;
    return;
  }
  if (asked !== trendsAsked) return;
  if (!windowChosen && doc.window != null) showWindow(doc.window);
  $("trends-panel").hidden = false;
  if (doc.note) {
    $("trends-summary").textContent = `${doc.note} (${doc.periods.length} so far).`;
    $("trend-charts").replaceChildren();
    return;
  }
  const verdict = new Map();
  for (const c of doc.changes) {
    if (c.trend !== "steady") {
      const list = verdict.get(c.query) || [];
      list.push(`${c.trend} ${c.from} → ${c.to}`);
      verdict.set(c.query, list);
    }
  }
  $("trends-summary").textContent = `${doc.rising} rising and ${doc.falling} falling of ${count(doc.tested)} changes `
    + `tested over ${doc.periods.length} published periods.`;
  const charts = Object.entries(doc.series).map(([query, points]) => {
    const what = verdict.get(query) || [];
    const rising = what.some((w) => w.startsWith("rising"));
    return h("figure", { class: `trend ${rising ? "rising" : "falling"}`, "data-query": query },
      h("figcaption", {}, h("strong", {}, query), " ", h("span", { class: "small" }, what.join("; "))),
      trendChart({ points, labels: doc.periods, title: `${query}: estimates per period`,
        description: `${query} ${what.join("; ")}` }));
  });
  $("trend-charts").replaceChildren(...charts);
}

async function main() {
  let doc;
  try {
    doc = await fetchJson(api);
  } catch (err) {
    $("load-status").textContent = err.message;
    $("load-status").classList.add("error");
    return;
  }
  $("load-status").hidden = true;
  renderSummary(doc);
  renderPeriods(doc);
  if (doc.kind === "blender") {
    $("window").addEventListener("change", () => {
      windowChosen = true;
      renderTrends();
    });
    await renderTrends();
  }
}

main();
