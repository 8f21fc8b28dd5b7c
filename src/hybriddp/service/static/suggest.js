// Matching typed text against the local-search document: pure functions, no DOM.

/** Lower case, accents and runs of spaces folded, trimmed: how queries and typed text are compared. */
export function normalize(text) {
  return String(text).normalize("NFKD").replace(/[\u0300-\u036f]/g, "").toLowerCase().replace(/\s+/g, " ").trim();
}

/**
 * The searchable index of a local-search document: one entry per query, with the positions where a typed
 * prefix may start (the start of the query and of every word in it).
 */
export function buildIndex(doc) {
  return doc.queries.map((q, rank) => {
    const norm = normalize(q.query);
    const starts = [0];
    for (let i = 1; i < norm.length; i++) {
      if (/[\s.\-_/]/.test(norm[i - 1]) && !/[\s.\-_/]/.test(norm[i])) starts.push(i);
    }
    return { query: q.query, p: q.p, urls: q.urls, norm, starts, rank };
  });
}

/**
 * The queries matching ``text`` (a prefix of the query or of one of its words), in the document's order
 * (the server's ranking of the suggestions: the blended probability, largest first, which a defended round
 * guards against fake devices, docs/ALGORITHM.md §7.2), at most ``limit``. Each match carries ``at``, the
 * index in the normalized query where the typed text matched.
 */
export function suggest(index, text, limit = 8) {
  const t = normalize(text);
  if (!t) return [];
  const out = [];
  for (const entry of index) {
    let at = -1;
    for (const s of entry.starts) {
      if (entry.norm.startsWith(t, s)) { at = s; break; }
    }
    if (at >= 0) out.push({ ...entry, at, length: t.length });
  }
  out.sort((a, b) => a.rank - b.rank);
  return out.slice(0, limit);
}
