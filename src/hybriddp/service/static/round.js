// The curator's round page: state, counts, parameters, privacy guarantee, results chart and table.

import { count, fetchJson, h, num, percent, shown } from "./api.js";
import { intervalChart, interval95 } from "./chart.js";

const LIFECYCLE = ["collecting-optin", "headlist-published", "collecting-reports", "closed", "results-held",
  "results-published"];
const ENDED = {
  "headlist-empty": "This round has ended: no opt-in record passed the head list's privacy threshold. That outcome "
    + "was the curator's release (charged to the opt-in users), so the round has no results; its raw opt-in data "
    + "are deleted.",
  aborted: "This round was aborted before its head list was published; its raw opt-in data are deleted.",
  deleted: "This round was deleted: its raw data, reports, documents and results are gone.",
};
const PARAM_NAMES = {
  epsilon: "ε", delta: "δ", optin_fraction: "opt-in fraction",
  f_o: "f_O (share of opt-in users building the head list)", f_c: "f_C (share of a client's budget on the query)",
  head_list_size: "M (head-list size)", m_o: "m_O (records per opt-in user)", m_c: "m_C (records per client)",
  project: "project onto the simplex", noise: "noise", url_level: "URL level",
  lower: "lower bound", upper: "upper bound", sigma2: "σ² (given variance of the values)",
  variance_share: "share of ε spent estimating σ²", seed: "seed",
  defense: "defense against fake reports", anchor_alpha: "false-alarm rate α of the check",
  anchor_kappa: "bound κ of the estimates (standard deviations from the opt-in estimate; none: per round)",
  anchor_honest_cost: "largest share of an honest estimate's variance the per-round bound adds",
  anchor_kappa_query: "ranking guard κ_q of the suggestions (standard deviations above the opt-in estimate; null: per round)",
  anchor_rank_cost: "largest expected NDCG@10 the per-round ranking guard costs an honest round",
};
const TOP = 10;

const $ = (id) => document.getElementById(id);
const roundId = decodeURIComponent(location.pathname.replace(/\/+$/, "").split("/").pop());
const api = `/api/v1/rounds/${encodeURIComponent(roundId)}`;

function show(id) {
  $(id).hidden = false;
}

function stateBadge(state) {
  const kind = state === "results-published" ? "ok" : state === "closed" || state === "results-held" ? "warn" : "";
  return h("span", { class: `badge ${kind}` }, state);
}

function renderSummary(info) {
  document.title = `${info.name || info.id} · round · hybriddp`;
  $("round-name").textContent = shown(info.name || `Round ${info.id}`);
  $("round-state").replaceChildren(stateBadge(info.state));
  $("round-id").textContent = `${info.kind} round ${info.id}`;
  $("round-created").textContent = ` · created ${new Date(info.created).toLocaleString()}`;
  if (info.series) { // a period of a round series: its page has the trends across the periods
    $("round-created").append(" · ", h("a", { href: `/series/${encodeURIComponent(info.series.id)}`, id: "series-link" },
      `period ${info.series.period} of a series`));
  }
  if (info.warning) {
    $("round-warning").textContent = info.warning;
    show("round-warning");
  }
  // a round that ended early (empty head list, aborted, deleted) shows where it ended
  const steps = LIFECYCLE.includes(info.state) || info.state === "building-headlist"
    ? LIFECYCLE : ["collecting-optin", info.state];
  const at = steps.indexOf(info.state === "building-headlist" ? "collecting-optin" : info.state);
  $("lifecycle").replaceChildren(...steps.map((s, i) => h("li", {
    class: i < at ? "done" : "", "aria-current": i === at ? "step" : null,
  }, s)));
  show("summary");

  const c = info.counts;
  const cells = [["opt-in users", c.optin_users], ["opt-in records", c.optin_records],
    ["device messages", c.messages], ["device reports", c.reports]];
  $("counts").replaceChildren(...cells.map(([what, n]) => h("div", { class: "count" },
    h("div", { class: "n" }, count(n)), h("div", { class: "what" }, what))));
  show("counts-panel");

  const known = Object.keys(PARAM_NAMES);
  const order = (k) => (known.includes(k) ? known.indexOf(k) : known.length);
  const params = Object.entries(info.params).sort(([a], [b]) => order(a) - order(b));
  $("params").replaceChildren(...params.flatMap(([k, v]) => [
    h("dt", {}, PARAM_NAMES[k] || k),
    h("dd", {}, v === null ? "none" : typeof v === "boolean" ? (v ? "yes" : "no") : num(v)),
  ]));
  if (info.headlist_hash) {
    // the whole content hash, which commits to the round's token key: compare it with what devices and mirrors
    // see (docs/TOKENS.md "Consistency")
    $("params").append(h("dt", {}, info.kind === "blender" ? "head list (content hash)" : "round document"),
      h("dd", { class: "mono small hash", title: "compare with the hash your device and the relay's mirror see" },
        info.headlist_hash));
  }
  show("params-panel");
}

/** A CamelCase name with a line-break opportunity before each inner capital (EstimateOptin<wbr>Probabilities). */
function camelBreaks(name) {
  return String(name).split(/(?<=[a-z])(?=[A-Z])/).flatMap((part, i) => (i ? [h("wbr"), part] : [part]));
}

function renderPrivacy(info, results) {
  const box = $("privacy");
  const p = info.params;
  if (results && results.privacy) {
    const pr = results.privacy;
    box.replaceChildren(
      h("dl", { class: "facts" },
        h("dt", {}, "opt-in users"), h("dd", {}, pr.optin_users),
        h("dt", {}, "client devices"), h("dd", {}, pr.clients),
        h("dt", {}, "noise"), h("dd", {}, pr.noise || "")),
      h("div", { class: "table-wrap" }, h("table", { class: "results" },
        h("thead", {}, h("tr", {}, ["group", "mechanism", "ε", "δ"].map((t, i) =>
          h("th", { scope: "col", class: i > 1 ? "num" : "" }, t)))),
        h("tbody", {}, (pr.mechanisms || []).map((m) => h("tr", {},
          h("td", { class: "group" }, m.group),
          h("td", {}, camelBreaks(m.mechanism), h("br"),
            h("span", { class: "muted small" }, [m.model, m.reference].filter(Boolean).join(", "))),
          h("td", { class: "num" }, num(m.epsilon)), h("td", { class: "num" }, num(m.delta))))))));
  } else if (results && results.guarantee) {
    box.replaceChildren(h("p", {}, typeof results.guarantee === "string" ? results.guarantee
      : JSON.stringify(results.guarantee)));
  } else {
    box.replaceChildren(h("p", {}, `Each opt-in user: (${num(p.epsilon)}, ${num(p.delta)})-differential privacy ` +
      "against the curator's release; each client device: " +
      `(${num(p.epsilon)}, ${num(p.delta)})-local differential privacy for its report.`),
    h("p", { class: "small muted" }, "The full accounting per mechanism is shown once the results are published."));
  }
  show("privacy-panel");
}

function renderCheck(results) {
  const c = results.anchor_check;
  const box = $("check");
  if (!c) {
    box.replaceChildren(h("p", { class: "error" }, "No defense: these results were computed without the check "
      + "against the opt-in group, so fake device reports could have steered them."));
    show("check-panel");
    return;
  }
  const flagged = c.flagged ?? ((c.flagged_records || 0) + (c.flagged_queries || 0) > 0);
  const facts = results.algorithm === "hybrid-mean"
    ? [["z of the devices' mean against the opt-in mean", c.z === null ? "–" : num(c.z)],
      ["critical z (α = " + c.alpha + ")", num(c.critical_z)], ["flagged", flagged ? "yes" : "no"],
      ["bounded", c.clamped ? "yes" : "no"], ["hybrid mean before the check", num(c.undefended)]]
    : [["records flagged", count(c.flagged_records)], ["queries flagged", count(c.flagged_queries)],
      ["estimates bounded (κ = " + c.kappa + (c.kappa_query === undefined ? "" : ", queries " + c.kappa_query) + ")", count(c.clamped_records + c.clamped_queries)],
      ["largest |z| (critical " + num(c.critical_z) + ", α = " + c.alpha + ")", num(c.max_abs_z)],
      ["fake reports, at least", `${count(Math.round(c.excess_reports))} (${percent(c.fake_fraction_lower, 2)})`],
      ["largest change by the check", `${percent(c.largest_change_query, 3)} (queries), `
        + `${percent(c.largest_change_record, 3)} (records)`]];
  box.replaceChildren(
    h("p", { class: flagged ? "error" : "" }, c.verdict + (c.withheld ? "; the flagged entries are left out." : ".")),
    h("dl", { class: "facts" }, facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    h("p", { class: "small muted" }, "Every estimate from the devices is tested against the opt-in group's, "
      + "which no device can influence; a flagged one is published from the opt-in group, and no published "
      + "estimate lies more than κ standard deviations from its opt-in estimate (docs/ALGORITHM.md §7.2)."));
  show("check-panel");
}

/** GET JSON with the administrator token (held results, docs/ALGORITHM.md §7.2); the token goes to this server
 * only, in the Authorization header, and is kept nowhere. */
async function fetchAdmin(url, token) {
  let response;
  try {
    response = await fetch(url, { headers: { Accept: "application/json", Authorization: `Bearer ${token}` },
      cache: "no-store" });
  } catch (err) {
    throw new Error(`GET ${url}: the server cannot be reached (${err.message})`);
  }
  const doc = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error(`GET ${url}: HTTP ${response.status}: ${doc && doc.error ? doc.error.message : response.statusText}`);
  }
  return doc;
}

/** What an administrator judges flagged results by (anchor_check, docs/ALGORITHM.md §7.2 "Judging held results"):
 * each flagged entry's opt-in and device estimates, the test, the estimated fake reports that would explain the gap,
 * and what keep / remove would publish; for a mean round the same for the mean. */
function renderHeld(results) {
  const c = results.anchor_check || {};
  const box = $("held");
  if (results.algorithm === "hybrid-mean") {
    if (c.optin_mean === undefined || !c.flagged) return false; // nothing to judge
    const facts = [["opt-in mean", num(c.optin_mean)], ["device mean", c.client_mean === null ? "–" : num(c.client_mean)],
      ["z (critical ±" + num(c.critical_z) + ")", c.z === null ? "–" : num(c.z)],
      [`extreme values at ${num(c.extreme_value)} that explain the gap`,
        c.estimated_fake_values === null ? "–" : count(c.estimated_fake_values)],
      ["keep publishes the hybrid mean", c.published_if_kept === null ? "–" : num(c.published_if_kept)],
      ["remove publishes", "no hybrid mean"]];
    box.replaceChildren(h("dl", { class: "facts", id: "held-facts" },
      facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
    return true;
  }
  const entries = c.flagged_entries;
  if (!entries || !entries.length) return false;
  const head = ["entry", "opt-in", "devices", "z", "p-value (≤ Holm level)", "fake reports (estimated)",
    "keep publishes", "remove publishes", "undefended blend"];
  const rows = entries.map((e) => h("tr", {},
    h("td", {}, e.level === "query" ? `query ${e.query}` : [e.query, h("br"), h("span", { class: "url" }, e.url)]),
    h("td", { class: "num" }, percent(e.p_optin, 3)), h("td", { class: "num" }, percent(e.p_client, 3)),
    h("td", { class: "num" }, e.z === null ? "–" : e.z.toFixed(2)),
    h("td", { class: "num" }, e.p_value === null ? "–" : `${num(e.p_value)} (≤ ${num(e.p_threshold)})`),
    h("td", { class: "num" }, e.estimated_fake_reports === null ? "–" : count(e.estimated_fake_reports)),
    h("td", { class: "num" }, percent(e.published_if_kept, 3)),
    h("td", { class: "num" }, e.published_if_removed === null
      ? (e.level === "query" ? `left out (${e.records_left_out_if_removed} records)` : "left out")
      : percent(e.published_if_removed, 3)),
    h("td", { class: "num" }, percent(e.undefended, 3))));
  const kept = c.published_if_kept;
  const removed = c.published_if_removed;
  box.replaceChildren(
    h("div", { class: "table-wrap" }, h("table", { class: "results", id: "held-table" },
      h("caption", { class: "visually-hidden" }, "Flagged entries and what each choice publishes"),
      h("thead", {}, h("tr", {}, head.map((t, i) => h("th", { scope: "col", class: i ? "num" : "" }, t)))),
      h("tbody", {}, rows))),
    kept && removed ? h("p", { class: "small" }, `keep publishes ${kept.records} records and ${kept.queries} queries `
      + `(flagged entries with their opt-in estimates); remove publishes ${removed.records} records and `
      + `${removed.queries} queries.`) : "",
    h("p", { class: "small muted" }, "z: the gap between the devices' and the opt-in estimate in standard "
      + "deviations, flagged at p ≤ its Holm level. Fake reports: how many reports of that entry alone would explain "
      + "the gap, if the opt-in estimate were exact — far more than the noise of z allows points at an attack."));
  return true;
}

function legend(series) {
  $("legend").replaceChildren(...series.map((s) => h("span", { class: s.className }, s.name)));
}

function renderBlender(info, results) {
  const records = results.records || [];
  const series = [
    { key: "blended", name: "blended", className: "blended" },
    { key: "optin", name: "opt-in", className: "optin" },
    { key: "client", name: "client", className: "client" },
  ];
  const top = records.filter((r) => !r.wildcard && Number.isFinite(r.p_blended))
    .sort((a, b) => b.p_blended - a.p_blended).slice(0, TOP);
  legend(series);
  const rows = top.map((r) => ({
    label: r.query,
    sublabel: r.url.replace(/^https?:\/\//, ""),
    values: {
      blended: { estimate: r.p_blended, variance: r.var_blended },
      optin: { estimate: r.p_optin, variance: r.var_optin },
      client: { estimate: r.p_client, variance: r.var_client },
    },
  }));
  $("chart").replaceChildren(
    intervalChart({ rows, series, format: (v) => percent(v, 1), title: `The ${rows.length} most probable records`,
      description: "For each record, the blended, opt-in and client estimates of its probability, with 95% " +
        "intervals. The results table below has the same numbers." }),
    h("figcaption", {}, `The ${rows.length} listed ⟨query, URL⟩ records with the largest blended probability. ` +
      "Each interval is the estimate ± 1.96 standard deviations of its reported error. The " +
      "blended estimate weights the opt-in and client estimates by their inverse variances; its reported error " +
      "also counts the defense's bound around the opt-in estimate, so its interval is not always the narrowest."));
  show("chart-panel");

  const ci = (p, v) => {
    const iv = interval95(p, v, 0, 1);
    return iv ? `${percent(iv[0])} – ${percent(iv[1])}${iv.clipped ? " ‡" : ""}` : "–";
  };
  const checked = (r) => (r.flagged ? "flagged: opt-in estimate" : r.clamped ? "bounded" : "");
  const head = ["query", "URL", "blended", "95% interval", "opt-in", "client", "opt-in weight", "check"];
  const numeric = new Set([2, 3, 4, 5, 6]);
  // listed records first, then the ⟨q,*⟩ and ⟨*,*⟩ rows; each by blended probability
  const sorted = [...records].sort((a, b) => (a.wildcard - b.wildcard) || ((b.p_blended ?? -1) - (a.p_blended ?? -1)));
  $("table").replaceChildren(h("table", { class: "results", id: "results-table" },
    h("caption", { class: "visually-hidden" }, "Estimated probability of every head-list record"),
    h("thead", {}, h("tr", {}, head.map((t, i) => h("th", { scope: "col", class: numeric.has(i) ? "num" : "" }, t)))),
    h("tbody", {}, sorted.map((r) => h("tr", { class: r.wildcard ? "wildcard" : "" },
      h("td", {}, r.query),
      h("td", { class: "url" }, !r.wildcard ? r.url : r.query === "*" ? "* (any other query)" : "* (any other URL)"),
      h("td", { class: "num" }, percent(r.p_blended, 3)), h("td", { class: "num" }, ci(r.p_blended, r.var_blended)),
      h("td", { class: "num" }, percent(r.p_optin, 3)), h("td", { class: "num" }, percent(r.p_client, 3)),
      h("td", { class: "num" }, Number.isFinite(r.weight_optin) ? r.weight_optin.toFixed(3) : "–"),
      h("td", { class: r.flagged ? "error" : "" }, checked(r)))))));
  show("table-panel");
}

function renderMean(info, results) {
  const est = results.estimates || [];
  const series = [{ key: "v", name: "estimate", className: "blended" }];
  const cls = { hybrid: "blended", optin: "optin", client: "client" };
  legend(est.map((e) => ({ name: e.estimator, className: cls[e.estimator] || "blended" })));
  const rows = est.map((e) => ({ label: e.estimator, className: cls[e.estimator] || "blended",
    values: { v: { estimate: e.estimate, variance: e.variance } } }));
  $("chart-h").textContent = "Estimates of the mean";
  $("chart").replaceChildren(
    intervalChart({ rows, series, format: num, title: "The mean: opt-in, client and hybrid estimates",
      description: "Each estimate of the mean with its 95% interval." }),
    h("figcaption", {}, "Estimates of the mean with 95% intervals (from their expected squared errors)."));
  show("chart-panel");
  $("table").replaceChildren(h("table", { class: "results", id: "results-table" },
    h("thead", {}, h("tr", {}, ["estimator", "estimate", "95% interval", "n", "opt-in weight"].map((t, i) =>
      h("th", { scope: "col", class: i ? "num" : "" }, t)))),
    h("tbody", {}, est.map((e) => {
      const iv = interval95(e.estimate, e.variance, info.params.lower, info.params.upper);
      return h("tr", {}, h("td", {}, e.estimator), h("td", { class: "num" }, num(e.estimate)),
        h("td", { class: "num" }, iv ? `${num(iv[0])} – ${num(iv[1])}${iv.clipped ? " ‡" : ""}` : "–"),
        h("td", { class: "num" }, count(e.n)),
        h("td", { class: "num" }, num(e.weight_optin)));
    }))));
  show("table-panel");
}

function downloads(info) {
  const links = [["JSON", "json"], ["CSV", "csv"], ["Parquet", "parquet"]].map(([name, f]) =>
    h("a", { href: `${api}/results?format=${f}` }, name));
  const parts = ["Download the results: ", links[0], " · ", links[1], " · ", links[2]];
  if (info.kind === "blender") {
    parts.push(" · ", h("a", { href: `${api}/local-search` }, "local-search document"),
      " · ", h("a", { href: `/?round=${encodeURIComponent(info.id)}` }, "search with this round"));
  }
  $("downloads").replaceChildren(...parts);
}

/** The forecast of a BLENDER round still collecting opt-in data (GET …/forecast, administrator token; docs/TUNE.md
 * "Sizing a round"): its sentences, and its warnings (a round that will likely list nothing) as errors. */
function setupForecast() {
  show("forecast-panel");
  $("forecast-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = $("forecast-token");
    const users = $("forecast-optin").value.trim();
    try {
      const doc = await fetchAdmin(`${api}/forecast${users ? `?optin_users=${encodeURIComponent(users)}` : ""}`,
        token.value.trim());
      $("forecast").replaceChildren(h("ul", { class: "forecast" }, ...doc.lines.map((line) => h("li", {}, line))),
        ...doc.warnings.map((w) => h("p", { class: "error", role: "alert" }, `Warning: ${w}.`)));
      document.body.dataset.forecast = users || "uploaded";
    } catch (err) {
      $("forecast").replaceChildren(h("p", { class: "error" }, err.message));
    }
  });
}

async function start() {
  const status = $("load-status");
  try {
    const info = await fetchJson(api);
    renderSummary(info);
    let results = null;
    if (info.state === "results-published") {
      results = await fetchJson(`${api}/results`);
      downloads(info);
      renderCheck(results);
      if (info.kind === "blender") renderBlender(info, results);
      else renderMean(info, results);
      status.textContent = "";
      status.hidden = true;
      if (renderHeld(results)) {
        $("held-intro").textContent = "The check against the opt-in group flagged these entries (docs/ALGORITHM.md "
          + "§7.2).";
        $("admin-form").hidden = true;
        show("held-panel");
      }
    } else if (info.state === "results-held") {
      status.textContent = "The check against the opt-in group flagged this round's results: an administrator "
        + "decides whether to publish them, with or without the flagged entries (docs/ALGORITHM.md §7.2).";
      show("held-panel");
      $("admin-form").addEventListener("submit", async (event) => {
        event.preventDefault();
        const input = $("admin-token");
        try {
          const held = await fetchAdmin(`${api}/results`, input.value.trim());
          input.value = "";
          renderHeld(held);
          renderCheck(held);
          document.body.dataset.held = "shown";
        } catch (err) {
          $("held").replaceChildren(h("p", { class: "error" }, err.message));
        }
      });
    } else if (ENDED[info.state]) {
      status.textContent = ENDED[info.state];
    } else {
      status.textContent = `Results are published once an administrator closes the round (now: ${info.state}).`;
      if (info.kind === "blender" && info.state === "collecting-optin") setupForecast();
    }
    renderPrivacy(info, results);
    document.body.dataset.ready = "true";
  } catch (err) {
    status.replaceChildren(h("span", { class: "error" }, err.message));
    document.body.dataset.ready = "error";
  }
}

start();
