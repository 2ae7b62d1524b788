"""Router mode: `mlxcel-server --models-dir DIR` without -m.

One router process lists every checkpoint it can find (catalog.py), starts
one `mlxcel-server -m MODEL` child per model on demand on a loopback port
(pool.py), and forwards each request to the child its `model` names
(proxy.py), streaming the answer back as it comes.  The router itself runs
no MLX: it owns discovery, load / unload / LRU eviction, the inventory
routes and the API-key gate (app.py).

Why children rather than engines in this process (docs/router.md has the
measurements): a model's memory comes back whole when its process exits, a
model that crashes takes nothing else down, and each child is exactly the
single-model server, so every route, stream session and cancellation path
behaves through the router as it does without it.  The cost is one loopback
hop per request and per streamed frame.
"""
