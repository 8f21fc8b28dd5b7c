// The local-search document kept in the browser (localStorage), so search works with the network gone.

const KEY = "hybriddp-local-search";

/** Is ``doc`` shaped like GET /api/v1/rounds/{id}/local-search's answer? (A damaged copy is dropped.) */
export function isLocalSearchDoc(doc) {
  return doc !== null && typeof doc === "object" && typeof doc.round === "string" && Array.isArray(doc.queries)
    && doc.queries.every((q) => q && typeof q.query === "string" && typeof q.p === "number" && Array.isArray(q.urls)
      && q.urls.every((u) => u && typeof u.url === "string" && typeof u.p === "number"));
}

/** The kept document ({doc, saved}) or null (none kept, storage unavailable, or damaged). */
export function loadKept(storage = globalThis.localStorage) {
  try {
    const raw = storage.getItem(KEY);
    if (raw === null) return null;
    const kept = JSON.parse(raw);
    return kept && isLocalSearchDoc(kept.doc) ? kept : null;
  } catch {
    return null;
  }
}

/** Keep ``doc``; false when the browser refuses (private mode, quota): the page then searches from memory. */
export function keep(doc, storage = globalThis.localStorage) {
  try {
    storage.setItem(KEY, JSON.stringify({ doc, saved: new Date().toISOString() }));
    return true;
  } catch {
    return false;
  }
}
