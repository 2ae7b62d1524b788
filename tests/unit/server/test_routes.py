"""protocol/routes.py: what a Route tells the mount (body, path parameters)."""

from __future__ import annotations

from mlxcel_trio.protocol.routes import ROUTES, UI_ROUTES, Route, quart_rule


def test_path_parameters_are_read_off_the_path():
    assert Route("POST", "/slots/:id_slot", "slot_actions").params == ("id_slot",)
    assert Route("GET", "/v1/responses/:response_id", "x").params == ("response_id",)
    assert Route("GET", "/health", "health").params == ()
    assert quart_rule("/v1/responses/:response_id/cancel") == "/v1/responses/<response_id>/cancel"


def test_routes_sharing_a_handler_agree_on_what_it_takes():
    takes: dict[str, tuple[bool, tuple[str, ...]]] = {}
    for route in ROUTES:
        seen = takes.setdefault(route.handler, (route.body, route.params))
        assert seen == (route.body, route.params), route


def test_only_post_routes_read_a_body():
    assert all(r.method == "POST" for r in ROUTES if r.body)


def test_the_app_mounts_every_route_with_a_handler_that_takes_its_arguments():
    """create_app binds each handler to its route's arguments at startup (a
    stand-in bridge: nothing is called before a request)."""
    from types import SimpleNamespace

    from mlxcel_trio.config import ServerConfig
    from mlxcel_trio.server.app import create_app

    for slot_save_path in (None, "/tmp"):
        app = create_app(SimpleNamespace(), ServerConfig(model="x", slot_save_path=slot_save_path),
                         "m")
        mounted = {(m, rule.endpoint.split(" ", 1)[1])
                   for rule in app.url_map.iter_rules() if rule.endpoint != "static"
                   for m in rule.methods if m in ("GET", "POST", "DELETE")}
        assert mounted >= {(r.method, r.path) for r in ROUTES if not (r.vertex or r.router)}
        assert not mounted & {(r.method, r.path) for r in ROUTES if r.router}


def test_the_router_mounts_every_route():
    """Router mode answers the model-management routes itself and forwards
    every other route of the table; with --ui (the default) it serves the
    web UI's files too, as upstream's router does."""
    from mlxcel_trio.config import ServerConfig
    from mlxcel_trio.server.router.app import create_router_app
    from mlxcel_trio.server.router.pool import Pool

    pool = Pool({}, (), 4, {}, read_inputs=lambda path, media: ("text",))
    app = create_router_app(ServerConfig(model="", router=True), pool, {})
    mounted = {(m, rule.endpoint.split(" ", 1)[1])
               for rule in app.url_map.iter_rules() if rule.endpoint != "static"
               for m in rule.methods if m in ("GET", "POST", "DELETE")}
    assert mounted == {(r.method, r.path) for r in ROUTES if not r.vertex} | \
        {("GET", r.path) for r in UI_ROUTES}
