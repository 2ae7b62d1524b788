// mlxcel-trio's service worker: registered so the page can be installed, and
// deliberately inert.  It has no fetch handler, so every request (the page's
// files and every API call) goes to the server as if no worker existed; it
// keeps no cache.  On activation it deletes the caches a previous worker of
// this origin left behind (a web UI served earlier on the same host and port
// may have precached its own files), so a stale page is never shown.
'use strict';

self.addEventListener('install', () => {
  self.skipWaiting();
});

self.addEventListener('activate', (event) => {
  event.waitUntil(
    caches.keys()
      .then((names) => Promise.all(names.map((name) => caches.delete(name))))
      .then(() => self.clients.claim()),
  );
});
