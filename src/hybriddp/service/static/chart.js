// An interval chart in SVG, drawn here (no library): for each row, one estimate per series with its
// 95% interval (estimate ± 1.96·√variance), series side by side, a shared horizontal axis.

const SVG = "http://www.w3.org/2000/svg";
const Z95 = 1.959963984540054; // the standard normal's 97.5% quantile

function el(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  return node;
}

/** The 95% interval [low, high] of an estimate with this variance (null when the variance is unknown). */
export function interval95(estimate, variance, lo = -Infinity, hi = Infinity) {
  if (!Number.isFinite(estimate) || !Number.isFinite(variance) || variance < 0) return null;
  const half = Z95 * Math.sqrt(variance);
  const iv = [Math.max(lo, estimate - half), Math.min(hi, estimate + half)];
  iv.clipped = iv[0] > estimate - half || iv[1] < estimate + half;  // cut at the range a value can take
  return iv;
}

/** About ``n`` round tick values covering [lo, hi]. */
export function ticks(lo, hi, n = 5) {
  const span = hi - lo || Math.abs(hi) || 1;
  const raw = span / n;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((s) => span / s <= n) ?? 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  }
  return out;
}

/**
 * Draw the chart.
 * rows: [{label, sublabel?, className?, values: {seriesKey: {estimate, variance}}}]; series: [{key, name, className}];
 * format: a tick/value formatter. Returns the <svg> element (role="img", titled, described).
 */
export function intervalChart({ rows, series, format, title, description }) {
  const labelWidth = 210;
  const right = 24;
  const width = 760;
  const band = 16 * series.length + 14;
  const top = 14;
  const axisHeight = 34;
  const height = top + rows.length * band + axisHeight;
  let lo = 0;
  let hi = 0;
  for (const row of rows) {
    for (const s of series) {
      const v = row.values[s.key];
      if (!v || !Number.isFinite(v.estimate)) continue;
      const ci = interval95(v.estimate, v.variance) ?? [v.estimate, v.estimate];
      lo = Math.min(lo, ci[0], v.estimate);
      hi = Math.max(hi, ci[1], v.estimate);
    }
  }
  if (hi <= lo) hi = lo + 1;
  const pad = (hi - lo) * 0.03;
  lo -= lo < 0 ? pad : 0;
  hi += pad;
  const x = (v) => labelWidth + ((v - lo) / (hi - lo)) * (width - labelWidth - right);

  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-labelledby": "chart-title chart-desc",
    class: "interval-chart" });
  svg.append(el("title", { id: "chart-title" }, title), el("desc", { id: "chart-desc" }, description));

  const axisY = top + rows.length * band;
  for (const t of ticks(lo, hi)) {
    const g = el("g", { class: "tick" });
    g.append(el("line", { class: t === 0 ? "zero" : "grid", x1: x(t), x2: x(t), y1: top - 4, y2: axisY }));
    g.append(el("text", { x: x(t), y: axisY + 16, "text-anchor": "middle" }, format(t)));
    svg.append(g);
  }
  svg.append(el("line", { class: "axis", x1: labelWidth, x2: width - right, y1: axisY, y2: axisY }));

  rows.forEach((row, i) => {
    const y0 = top + i * band;
    const g = el("g", { class: "row", "data-label": row.label });
    // two lines: the row's label and, muted, its sub-label (e.g. a query and its URL), each cut to fit
    const cut = (t, n) => (t.length > n ? `${t.slice(0, n - 1)}…` : t);
    const mid = y0 + band / 2;
    const text = el("text", { class: "row-label", x: labelWidth - 12, y: row.sublabel ? mid - 2 : mid + 4,
      "text-anchor": "end" }, cut(row.label, 30));
    text.append(el("title", {}, row.sublabel ? `${row.label} · ${row.sublabel}` : row.label));
    if (row.sublabel) {
      g.append(el("text", { class: "label", x: labelWidth - 12, y: mid + 12, "text-anchor": "end" },
        cut(row.sublabel, 34)));
    }
    g.append(text);
    series.forEach((s, j) => {
      const v = row.values[s.key];
      if (!v || !Number.isFinite(v.estimate)) return;
      const y = y0 + 7 + j * 16 + 4;
      const ci = interval95(v.estimate, v.variance);
      const cls = row.className || s.className; // a row may have its own colour (one series, several estimators)
      const mark = el("g", { class: `mark ${cls}`, "data-series": s.key });
      if (ci) {
        mark.append(el("line", { class: `ci ${cls}`, x1: x(ci[0]), x2: x(ci[1]), y1: y, y2: y }));
        for (const end of ci) {
          mark.append(el("line", { class: cls, x1: x(end), x2: x(end), y1: y - 4, y2: y + 4 }));
        }
      }
      mark.append(el("circle", { class: cls, cx: x(v.estimate), cy: y, r: 4 }));
      mark.append(el("title", {}, `${row.label} · ${s.name}: ${format(v.estimate)}` +
        (ci ? ` (95% interval ${format(ci[0])} to ${format(ci[1])})` : "")));
      g.append(mark);
    });
    svg.append(g);
  });
  return svg;
}

/**
 * A query's estimates over periods: one point per period with its 95% interval (estimate ± 1.96·sd), joined by a
 * line where consecutive periods have one; a period where the query was not listed is a gap.
 * points: [[estimate, sd] | null] per period; labels: the periods' labels. Returns the <svg> (role="img").
 */
export function trendChart({ points, labels, title, description, format = (v) => v.toFixed(4) }) {
  const width = 340;
  const height = 170;
  const left = 52;
  const right = 10;
  const top = 10;
  const bottom = 26;
  const ivs = points.map((pt) => (pt ? [Math.max(0, pt[0] - Z95 * pt[1]), pt[0] + Z95 * pt[1]] : null));
  const present = ivs.filter((iv) => iv !== null);
  let lo = Math.min(...present.map((iv) => iv[0]), 0);
  let hi = Math.max(...present.map((iv) => iv[1]), 1e-9);
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) [lo, hi] = [0, 1];
  const span = Math.max(1, points.length - 1);
  const x = (i) => left + ((width - left - right) * i) / span;
  const y = (v) => top + (height - top - bottom) * (1 - (v - lo) / (hi - lo || 1));
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", class: "trend-chart" });
  svg.append(el("title", {}, title), el("desc", {}, description));
  for (const t of ticks(lo, hi, 4)) {
    svg.append(el("line", { x1: left, x2: width - right, y1: y(t), y2: y(t), class: "grid" }));
    svg.append(el("text", { x: left - 4, y: y(t) + 3, "text-anchor": "end", class: "tick" }, format(t)));
  }
  labels.forEach((label, i) => {
    if (labels.length <= 12 || i % Math.ceil(labels.length / 12) === 0) {
      svg.append(el("text", { x: x(i), y: height - 8, "text-anchor": "middle", class: "tick" },
        label.replace(/^period /, "")));
    }
  });
  let path = "";
  points.forEach((pt, i) => {
    if (!pt) {
      path += " ";
      return;
    }
    path += `${path.endsWith(" ") || path === "" ? "M" : "L"}${x(i).toFixed(1)},${y(pt[0]).toFixed(1)}`;
  });
  svg.append(el("path", { d: path.trim().replace(/ +/g, " "), class: "trend-line", fill: "none" }));
  points.forEach((pt, i) => {
    if (!pt) return;
    const [a, b] = ivs[i];
    const g = el("g", { class: "trend-point", "data-period": labels[i] });
    g.append(el("line", { x1: x(i), x2: x(i), y1: y(a), y2: y(b), class: "interval" }));
    g.append(el("circle", { cx: x(i), cy: y(pt[0]), r: 3 }));
    g.append(el("title", {}, `${labels[i]}: ${format(pt[0])} (95% interval ${format(a)}–${format(b)})`));
    svg.append(g);
  });
  return svg;
}
