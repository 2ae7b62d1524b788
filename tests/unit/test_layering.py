"""The house's layering, read off the import statements of every module.

The rule (docs/architecture.md): the engine never imports trio nor chat
rendering, and everything that crosses the thread boundary goes through the
bridge.  The records both sides speak live in protocol/, which imports
neither side.  Imports are parsed (ast), not executed, so a function-level
import counts as much as a top-level one; only protocol/'s "light at
runtime" check ignores `if TYPE_CHECKING:` blocks, which never run.
"""

from __future__ import annotations

import ast
import sys
from functools import lru_cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "mlxcel_trio"
WEB = ("trio", "quart", "quart_trio", "hypercorn")
# The only modules outside engine/ that may import it, and what each may
# import: the bridge builds the engine thread's object (the loop, from its
# spec); the runner asks the pre-load checks and plans the ranks before
# anything loads.  (If either moves, the new place is named here alone.)
ENGINE_ENTRIES = {
    "mlxcel_trio.bridge": ("mlxcel_trio.engine.loop.EngineLoop",
                           "mlxcel_trio.engine.spec.EngineSpec"),
    "mlxcel_trio.server.runner": ("mlxcel_trio.engine.preflight",),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, package: str, guarded: bool = False):
    """(imported module, only under TYPE_CHECKING) for every import below `tree`;
    `from pkg import name` yields pkg.name (a submodule or an attribute: a
    prefix test covers both)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, guarded
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                yield f"{module}.{alias.name}", guarded
        else:
            yield from _imports(node, package,
                                guarded or (isinstance(node, ast.If) and _type_checking(node)))


@lru_cache(maxsize=1)
def modules() -> dict[str, tuple[tuple[str, bool], ...]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        out[name] = tuple(_imports(tree, package))
    return out


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _in(room: str) -> list[str]:
    return [m for m in modules() if _under(m, f"mlxcel_trio.{room}")]


def _engine_import_allowed(module: str, imp: str) -> bool:
    return _under(imp, *ENGINE_ENTRIES.get(module, ()))


def _offenders(rooms: list[str], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for m in rooms:
        hits = sorted({imp for imp, _ in modules()[m]
                       if _under(imp, *forbidden) and not _engine_import_allowed(m, imp)})
        if hits:
            bad[m] = hits
    return bad


def test_the_parser_sees_the_package():
    mods = modules()
    assert "mlxcel_trio.engine.loop" in mods and "mlxcel_trio.protocol.records" in mods
    # a relative import resolves: bridge.py imports the engine loop
    assert any(imp == "mlxcel_trio.engine.loop.EngineLoop" for imp, _ in mods["mlxcel_trio.bridge"])


def test_the_engine_knows_neither_trio_nor_the_server_nor_chat():
    forbidden = WEB + tuple(f"mlxcel_trio.{r}" for r in
                            ("server", "chat", "cli", "bridge", "monitor"))
    assert _offenders(_in("engine"), forbidden) == {}


def test_the_engine_builds_on_protocol_and_config_alone():
    """Within the package the engine reads only the seam's records, the
    resolved configuration (RoPE overrides), the process's BLAS choice
    (blas.py: the standard library only, read for the load summary) and
    the machine's free memory (memory_fit.py: config and protocol only)."""
    outside = {m: sorted({imp for imp, _ in modules()[m]
                          if _under(imp, "mlxcel_trio")
                          and not _under(imp, "mlxcel_trio.engine", "mlxcel_trio.protocol",
                                         "mlxcel_trio.config", "mlxcel_trio.blas",
                                         "mlxcel_trio.memory_fit")})
               for m in _in("engine")}
    assert {m: hits for m, hits in outside.items() if hits} == {}


@pytest.mark.parametrize("room", ["server", "cli", "chat", "grammar", "monitor"])
def test_the_trio_side_reaches_the_engine_only_through_protocol_and_bridge(room):
    assert _offenders(_in(room), ("mlxcel_trio.engine",)) == {}


def test_only_the_bridge_and_the_runner_reach_into_the_engine():
    """Everything that crosses the thread boundary goes through the bridge:
    outside engine/, only the place that builds the engine imports it (its
    loop and spec), and the runner its pre-load checks."""
    reach = {m: sorted({imp for imp, _ in imps if _under(imp, "mlxcel_trio.engine")})
             for m, imps in modules().items() if not _under(m, "mlxcel_trio.engine")}
    bad = {m: [imp for imp in hits if not _engine_import_allowed(m, imp)]
           for m, hits in reach.items()}
    assert {m: hits for m, hits in bad.items() if hits} == {}
    assert set(m for m, hits in reach.items() if hits) == set(ENGINE_ENTRIES)


def test_protocol_imports_neither_side():
    """protocol/ depends on nothing of the package but itself."""
    outside = {m: sorted({imp for imp, _ in modules()[m]
                          if _under(imp, "mlxcel_trio") and not _under(imp, "mlxcel_trio.protocol")})
               for m in _in("protocol")}
    assert {m: hits for m, hits in outside.items() if hits} == {}


def test_protocol_is_light_at_runtime():
    """The command line imports protocol/ before anything heavy: the standard
    library and attrs only (imports under TYPE_CHECKING never run)."""
    allowed = set(sys.stdlib_module_names) | {"attrs", "mlxcel_trio"}
    heavy = {m: sorted({imp for imp, guarded in modules()[m]
                        if not guarded and imp.split(".")[0] not in allowed})
             for m in _in("protocol")}
    assert {m: hits for m, hits in heavy.items() if hits} == {}


def test_only_the_bridge_and_the_server_touch_trio():
    """The bridge is the only module in both worlds; the HTTP side (server/,
    its runner included) is trio's own."""
    users = sorted(m for m, imps in modules().items()
                   if any(_under(imp, "trio") for imp, _ in imps))
    assert [m for m in users if m != "mlxcel_trio.bridge" and not _under(m, "mlxcel_trio.server")] \
        == []


def test_only_the_server_speaks_http():
    users = sorted(m for m, imps in modules().items()
                   if any(_under(imp, "quart", "quart_trio", "hypercorn") for imp, _ in imps))
    assert [m for m in users if not _under(m, "mlxcel_trio.server")] == []


def test_pure_libraries_stay_pure():
    """chat/ and grammar/ run without a server (DESIGN.md): no trio, no HTTP,
    no bridge, no server."""
    forbidden = WEB + tuple(f"mlxcel_trio.{r}" for r in ("server", "bridge", "cli", "monitor"))
    assert _offenders(_in("chat") + _in("grammar"), forbidden) == {}


def test_the_media_room_is_pure():
    """media/ (path confinement, the SSRF-guarded fetch, bounded decoding)
    runs without a server and without MLX: anyio, not trio, so it serves
    any event loop, and nothing of the engine."""
    forbidden = WEB + ("mlx",) + tuple(f"mlxcel_trio.{r}" for r in
                                       ("server", "bridge", "cli", "monitor", "engine"))
    assert _in("media") and _offenders(_in("media"), forbidden) == {}


# -- the graph as a whole: cycles, what is reached transitively, the server's rooms --

def _target(imp: str) -> str | None:
    """The package module an import names: the longest module prefix (a
    `from pkg import name` of an attribute lands on pkg)."""
    parts = imp.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in modules():
            return name
    return None


@lru_cache(maxsize=1)
def graph() -> dict[str, frozenset[str]]:
    """module -> the package modules it imports at run time, wherever the
    import statement sits (a function-level import counts; one under
    `if TYPE_CHECKING:` never runs and does not)."""
    return {m: frozenset(t for imp, guarded in imps
                         if not guarded and (t := _target(imp)) is not None and t != m)
            for m, imps in modules().items()}


def _cycles() -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph()[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph())))
    try:
        for v in graph():
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def _reach(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph()[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_the_package_has_no_import_cycle():
    assert _cycles() == []


def test_the_engine_and_config_reach_no_server_code_even_transitively():
    """What an engine module (or the configuration) imports, and what that
    imports in turn: never the trio side, never a web framework."""
    sides = ("mlxcel_trio.server", "mlxcel_trio.chat", "mlxcel_trio.cli", "mlxcel_trio.bridge",
             "mlxcel_trio.monitor")
    for start in [*_in("engine"), "mlxcel_trio.config"]:
        reached = _reach(start)
        assert sorted(m for m in reached if _under(m, *sides)) == [], start
        web = sorted({imp for m in reached | {start} for imp, guarded in modules()[m]
                      if not guarded and _under(imp, *WEB)})
        assert web == [], start


# The server's rooms, lowest first: a module imports (at run time) only its
# own room and the rooms before it.
SERVER_ROOMS = ("load_choices", "http", "adapters", "request", "sessions", "state",
                "drain", "surfaces", "app", "process", "router", "runner")


def _server_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "server" else None


def test_the_server_rooms_build_on_the_rooms_below_them():
    rooms = {m: _server_room(m) for m in modules() if _server_room(m) is not None}
    assert set(rooms.values()) <= set(SERVER_ROOMS), "a new server room: place it in the order"
    rank = {room: i for i, room in enumerate(SERVER_ROOMS)}
    upward = sorted((m, t) for m, room in rooms.items() for t in graph()[m]
                    if t in rooms and rank[rooms[t]] > rank[room])
    assert upward == []


# The command line and the server meet in one place: the console scripts'
# module hands cli's config to the server's runner (and `python -m
# mlxcel_trio` runs it).
ENTRY_POINTS = {"mlxcel_trio.entry", "mlxcel_trio.__main__"}


def test_cli_reaches_no_server_code_even_transitively():
    """cli/ parses, checks and resolves without the server: what it needs of
    the route table (the AIP_PREDICT_ROUTE check) is protocol/'s."""
    for start in _in("cli"):
        assert sorted(m for m in _reach(start) if _under(m, "mlxcel_trio.server")) == [], start


def test_only_the_entry_points_import_the_command_line():
    """Nothing below the console scripts imports cli/ (the router's children
    get their command line and environment through the config)."""
    users = sorted(m for m, targets in graph().items()
                   if not _under(m, "mlxcel_trio.cli") and any(_under(t, "mlxcel_trio.cli")
                                                               for t in targets))
    assert set(users) <= ENTRY_POINTS, users


# A private name a package re-exports for its tests: the native kernels'
# reset of the loaded library (engine/native/, the kernels' own room).
PRIVATE_REEXPORTS = {("mlxcel_trio.engine.native",
                      "mlxcel_trio.engine.native.library._reset_for_tests")}


def test_no_module_takes_another_modules_private_names():
    """`from x import _name` across modules of the package: a name another
    module needs is public (or the two share a public module)."""
    taken = {(m, imp) for m, imps in modules().items() for imp, _ in imps
             if imp.rpartition(".")[2].startswith("_")
             and not imp.rpartition(".")[2].startswith("__")
             and _under(imp, "mlxcel_trio")}
    assert taken == PRIVATE_REEXPORTS
