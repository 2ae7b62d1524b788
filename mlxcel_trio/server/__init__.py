"""The HTTP side: a QuartTrio app in four rooms around three top-level files.

    runner.py      the process: root nursery, signals, hypercorn, the bridge
    app.py         composition: middleware order, the handler table, mounting
    routes.py      the route table (method, path, handler name, flags)

    http/          what any route meets before and after its handler:
                   listen (hypercorn glue), CORS, API-key scope, body reading
                   and limits, upstream's error envelopes, SSE framing
    request/       from a JSON body to engine jobs: the native field table
                   and its parsing, the sampler / grammar / reasoning-budget
                   fields, chat request planning, job construction
    surfaces/      one module per API family: native /completion, OpenAI
                   completions and chat, Anthropic messages, Responses,
                   infill, tokenize, info (/health /props /models /slots),
                   /metrics, Vertex AI, audio transcriptions
    sessions/      state that outlives one request: stream sessions
                   (X-Conversation-Id), realtime control, stored responses,
                   slot files

Dependencies point down this list: surfaces use request, sessions and http;
request and sessions use http; nothing here imports the engine's internals,
only the records that cross the seam and the bridge.  docs/architecture.md
walks one request and one token through these rooms.
"""
