"""The HTTP side: a QuartTrio app in rooms, lowest first.

    load_choices.py  the startup line naming the load choices
    http/          what any route meets before and after its handler:
                   listen (hypercorn glue), app_shell.py (what both apps wrap
                   around their routes), CORS, API-key scope, body reading
                   and limits, errors.py (every error sentence: upstream's
                   envelopes, the engine's coded failures, the router's
                   refusals), SSE framing
    adapters.py    the LoRA adapter table
    request/       from a JSON body to engine jobs: the parsing generated
                   from protocol/fields.py, the sampler / grammar /
                   reasoning-budget fields, chat request planning, job
                   construction; served.py: what the routes need of the server
    sessions/      state that outlives one request: stream sessions
                   (X-Conversation-Id), realtime control, stored responses,
                   slot files, and the session store they speak to
    state.py       AppState
    drain.py       SIGTERM's drain
    surfaces/      one module per API family: native /completion, OpenAI
                   completions and chat, Anthropic messages, Responses,
                   infill, tokenize, info (/health /props /models /slots),
                   /metrics, Vertex AI, audio transcriptions
    app.py         composition: middleware order, the handler table, mounting
    process.py     what both runners share: shutdown signals, startup warnings
    router/        router mode: the catalog, the pool of child servers, the proxy
    runner.py      the process: root nursery, hypercorn, the bridge (or the router)

The route table they mount is protocol/routes.py.  A module imports only
its own room and the rooms above it in this list (tests/unit/test_layering.py
checks it); nothing here imports the engine's
internals, only the records that cross the seam, the bridge, and (the
runner) the engine's pre-load checks.  docs/architecture.md walks one
request and one token through these rooms.
"""
