// The local-search page's service worker (served as /sw.js, scope /): the page itself opens with the
// network gone. Network first, so an upgraded server's files are used as soon as it answers; the last
// good copy otherwise. The search document lives in localStorage (keep.js), not here.

const CACHE = "hybriddp-local-search-v1";
const SHELL = ["/", "/static/style.css", "/static/favicon.svg", "/static/search.js", "/static/api.js",
  "/static/suggest.js", "/static/keep.js", "/static/contribute.js", "/static/hybriddp-device.js"];
// answered from the cache when the server cannot be reached, marked so the page knows it is offline
const OFFLINE_API = ["/api/v1/local-search/rounds"];
const OFFLINE_HEADER = "X-HybridDP-Offline"; // api.js treats such an answer as "cannot be reached"

self.addEventListener("install", (event) => {
  event.waitUntil(caches.open(CACHE).then((cache) => cache.addAll([...SHELL, ...OFFLINE_API]))
    .then(() => self.skipWaiting()));
});

self.addEventListener("activate", (event) => {
  event.waitUntil(caches.keys()
    .then((names) => Promise.all(names.filter((n) => n.startsWith("hybriddp-") && n !== CACHE)
      .map((n) => caches.delete(n))))
    .then(() => self.clients.claim()));
});

async function networkFirst(request, key, mark) {
  const cache = await caches.open(CACHE);
  try {
    const response = await fetch(request);
    if (response.ok) await cache.put(key, response.clone());
    return response;
  } catch (err) {
    const kept = await cache.match(key);
    if (!kept) throw err;
    if (!mark) return kept;
    const headers = new Headers(kept.headers);
    headers.set(OFFLINE_HEADER, "1");
    return new Response(await kept.blob(), { status: kept.status, statusText: kept.statusText, headers });
  }
}

self.addEventListener("fetch", (event) => {
  const request = event.request;
  const url = new URL(request.url);
  if (request.method !== "GET" || url.origin !== self.location.origin) return;
  if (url.pathname === "/" && request.mode === "navigate") {
    event.respondWith(networkFirst(request, "/", false)); // "/?round=ID" too: the page reads the query itself
  } else if (SHELL.includes(url.pathname) && !url.search) {
    event.respondWith(networkFirst(request, url.pathname, false));
  } else if (OFFLINE_API.includes(url.pathname)) {
    event.respondWith(networkFirst(request, url.pathname, true));
  }
});
