"""The router's model instances: one `mlxcel-server -m MODEL` child each.

States are upstream's: "unloaded" (no process; `exit_code` set when the
last one exited on its own), "loading" (started, its model not loaded
yet), "loaded".  A child is loaded once it prints the single-model server's
"main: model loaded" line (it is listening by then).  Every child runs under
the router's nursery: a child that exits, whether asked to or not, goes
back to "unloaded" and the next request for it starts a new one.

Rules:
- One start per model at a time: concurrent first requests wait on the
  same start.
- --models-max bounds the running children; starting one past the bound
  stops the least recently used loaded child with no request in flight, or
  refuses with upstream's "model limit reached, try again later".
- The router's shutdown cancels every supervising task, and each stops its
  child (SIGTERM, then SIGKILL after the grace) before it returns.
- A loaded child is health-checked (GET /health every HEALTH_S, each bounded
  by HEALTH_S): after HEALTH_FAILS failures in a row (a stopped or wedged
  process that still holds its port) it is killed, reported "unloaded" with
  its exit code (failed), and started again; the other children are not
  touched.  HEALTH_ENV (an internal variable, not an option) shortens the
  period for tests.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping

import httpx
import trio

from ..http.errors import router_error
from .catalog import ModelEntry

log = logging.getLogger("mlxcel.router")

LOADED_LINE = b"main: model loaded"
STOP_GRACE_S = 10.0
HEALTH_ENV = "MLXCEL_INTERNAL_ROUTER_HEALTH_S"
HEALTH_S = float(os.environ.get(HEALTH_ENV) or 5.0)
HEALTH_FAILS = 3

ReadInputs = Callable[[str, bool], tuple[str, ...]]  # (checkpoint path, media on) -> modalities


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Instance:
    def __init__(self, entry: ModelEntry) -> None:
        self.entry = entry
        self.status = "unloaded"
        self.exit_code: int | None = None   # of the last child that exited on its own
        self.port: int | None = None
        self.process: trio.Process | None = None
        self.ready = trio.Event()           # set when a start ends: loaded, or failed
        self.last_used = 0.0
        self.inflight = 0                   # requests being forwarded to it now
        self.args: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded")

    @property
    def failed(self) -> bool:
        return self.status == "unloaded" and self.exit_code not in (None, 0)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# the spellings of --mmproj-auto a child's command line may hold (cli/options_model.py)
MEDIA_SPELLINGS = {"--mmproj-auto": True, "--no-mmproj": False, "--no-mmproj-auto": False}


class Pool:
    def __init__(self, entries: Mapping[str, ModelEntry], child_args: tuple[str, ...],
                 models_max: int, env: Mapping[str, str],
                 global_args: tuple[str, ...] = (), *,
                 read_inputs: ReadInputs, media: bool = True) -> None:
        self.instances = {name: Instance(e) for name, e in entries.items()}
        self.child_args = child_args
        self.global_args = global_args      # the [*] preset's options
        # a checkpoint's input modalities from its config (engine/preflight.py's,
        # handed in by server/runner.py), and the router's own --mmproj-auto
        self._read_inputs = read_inputs
        self._media = media
        self._inputs: dict[tuple[Path, bool], tuple[str, ...]] = {}
        self.models_max = models_max
        self.env = dict(env)
        self._nursery: trio.Nursery | None = None
        self._watchers: set[trio.MemorySendChannel] = set()
        # children asked to stop: their exit is not a failure.  Kept per
        # process, because a model stopped and started again at once has an
        # old child still exiting beside its new one.
        self._stopping: set[int] = set()
        self._unhealthy: set[int] = set()   # children killed by the health check

    def inputs(self, inst: Instance) -> tuple[str, ...]:
        """What `inst`'s model takes ("text", "image", "audio"), as its own
        server's /props will say once loaded: read from its config without
        loading it, with --no-mmproj as its command line would resolve it
        (the last spelling wins; without one, the router's own setting,
        which the environment's LLAMA_ARG_MMPROJ_AUTO reaches too)."""
        media = self._media
        for arg in (*self.global_args, *inst.entry.args, *self.child_args):
            media = MEDIA_SPELLINGS.get(arg, media)
        key = (inst.entry.path, media)
        if key not in self._inputs:
            self._inputs[key] = self._read_inputs(str(inst.entry.path), media)
        return self._inputs[key]

    # -- events (GET /models/sse) ---------------------------------------------

    def notify(self, event: str, model: str, data: dict | None = None) -> None:
        """upstream's {"model", "event"[, "data"]} to every watcher; a watcher
        too slow to take it is dropped (its stream ends)."""
        message = {"model": model, "event": event}
        if data is not None:
            message["data"] = data
        for ch in list(self._watchers):
            try:
                ch.send_nowait(message)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self._watchers.discard(ch)
                ch.close()

    def watch(self) -> trio.MemoryReceiveChannel:
        send, receive = trio.open_memory_channel(256)
        self._watchers.add(send)
        return receive

    def _status(self, inst: Instance, status: str) -> None:
        if inst.status == status:
            return
        inst.status = status
        data: dict = {"status": status}
        if status == "unloaded":
            data["exit_code"] = inst.exit_code if inst.exit_code is not None else 0
        self.notify("status_change", inst.name, data)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Own the children: they live in this nursery; cancelling it (the
        router's shutdown) stops them all."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def resolve(self, name: str) -> str | None:
        """A model's name from its name or one of its preset aliases."""
        if name in self.instances:
            return name
        return next((n for n, i in self.instances.items() if name in i.entry.aliases), None)

    async def remove(self, name: str, cache_root: Path) -> None:
        """DELETE /models: stop a cache model's server, then delete its
        repository from the cache, never anything outside `cache_root`."""
        inst = self.instances.get(name)
        if inst is None:
            raise router_error("remove_unknown", name=name)
        if inst.entry.source != "cache":
            raise router_error("not_removable", name=name)
        proc = inst.process
        if proc is not None:
            self.stop(inst)
            await proc.wait()
        from ... import downloads

        repo = downloads.removable(cache_root, name)
        if repo is None:
            raise router_error("not_removable", name=name)
        await trio.to_thread.run_sync(shutil.rmtree, repo, True)
        del self.instances[name]
        log.info("removed %s from the cache (%s)", name, repo)
        self.notify("model_remove", name, {})

    async def download(self, name: str, cache: Path, token: str | None) -> None:
        """POST /models after its checks: fetch `name` into the cache as a
        "downloading" model with download_progress events, then list it (or
        drop it again with download_failed)."""
        from ... import downloads

        inst = Instance(ModelEntry(name, downloads.repo_dir(cache, name), "cache"))
        inst.status = "downloading"
        self.instances[name] = inst
        self.notify("status_change", name, {"status": "downloading"})
        token_ = trio.lowlevel.current_trio_token()

        def progress(p: downloads.Progress) -> None:  # a worker thread
            try:
                trio.from_thread.run_sync(self.notify, "download_progress", name, p.to_json(),
                                          trio_token=token_)
            except trio.RunFinishedError:
                pass

        async def run() -> None:
            try:
                path = await trio.to_thread.run_sync(
                    lambda: downloads.fetch(name, token=token, cache=cache, on_progress=progress),
                    abandon_on_cancel=True)
            except downloads.DownloadError as exc:
                log.warning("download of %s failed: %s", name, exc)
                if self.instances.get(name) is inst:
                    del self.instances[name]
                self.notify("download_failed", name, {"error": str(exc)})
                return
            inst.entry = ModelEntry(name, path, "cache")
            inst.status = "unloaded"
            log.info("downloaded %s to %s", name, path)
            self.notify("download_finished", name, {})
            self.notify("status_change", name, {"status": "unloaded", "exit_code": 0})

        assert self._nursery is not None
        self._nursery.start_soon(run)

    def update(self, entries: Mapping[str, ModelEntry]) -> None:
        """A rescan: new models appear; a running model keeps its instance;
        configs are read again (a directory's checkpoint may have changed)."""
        self._inputs.clear()
        for name, entry in entries.items():
            inst = self.instances.get(name)
            if inst is None or (not inst.running and inst.entry != entry):
                self.instances[name] = Instance(entry)
        for name in [n for n, i in self.instances.items()
                     if n not in entries and not i.running and i.status != "downloading"]:
            del self.instances[name]

    # -- load ------------------------------------------------------------------

    def start(self, inst: Instance) -> None:
        """Begin loading `inst` (no-op when it is already running)."""
        if inst.running:
            return
        self._make_room()
        assert self._nursery is not None
        # a child still exiting from a stop belongs to its own supervising
        # task from now on: this start's state must not be touched by it
        inst.process, inst.exit_code = None, None
        self._status(inst, "loading")
        inst.ready = trio.Event()
        inst.port = free_port()
        inst.last_used = time.monotonic()
        # the [*] preset, the model's own, then the router's command line: the
        # last spelling of an option wins, so the router's flags win (upstream's order)
        inst.args = ("-m", str(inst.entry.path), "--host", "127.0.0.1",
                     "--port", str(inst.port), "--alias", inst.name, *self.global_args,
                     *inst.entry.args, *self.child_args)
        self._nursery.start_soon(self._supervise, inst)

    async def ready(self, name: str) -> Instance:
        """`name` loaded, starting it if needed; 503 when it cannot load."""
        inst = self.instances[name]
        if inst.status != "loaded":
            self.start(inst)
            await inst.ready.wait()
        if inst.status != "loaded":
            raise router_error("load_failed", name=name)
        inst.last_used = time.monotonic()
        return inst

    def _make_room(self) -> None:
        if self.models_max <= 0:
            return
        running = [i for i in self.instances.values() if i.running]
        if len(running) < self.models_max:
            return
        idle = sorted((i for i in running if i.status == "loaded" and i.inflight == 0),
                      key=lambda i: i.last_used)
        if not idle:
            raise router_error("models_max")
        log.info("unloading %s (least recently used) to stay within --models-max %d",
                 idle[0].name, self.models_max)
        self.stop(idle[0])

    async def _supervise(self, inst: Instance) -> None:
        argv = [sys.executable, "-m", "mlxcel_trio", *inst.args]
        log.info("starting %s on port %d", inst.name, inst.port)
        try:
            proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        except OSError as exc:
            log.error("%s: cannot start its server: %s", inst.name, exc)
            inst.exit_code = -1
            self._status(inst, "unloaded")
            inst.ready.set()
            return
        inst.process = proc
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._health, inst, proc)
                await self._relay(inst, proc)
                await proc.wait()
                nursery.cancel_scope.cancel()
        finally:
            if proc.returncode is None:  # the router is shutting down
                self._stopping.add(proc.pid)
                with trio.CancelScope(shield=True):
                    await self._terminate(proc)
            asked = proc.pid in self._stopping
            self._stopping.discard(proc.pid)
            if not asked:
                log.warning("%s: its server exited with code %s", inst.name, proc.returncode)
            if inst.process is proc:  # not replaced by a newer start meanwhile
                inst.process = None
                inst.exit_code = None if asked else proc.returncode
                self._status(inst, "unloaded")
                inst.ready.set()
                if proc.pid in self._unhealthy:
                    self._unhealthy.discard(proc.pid)
                    self.start(inst)   # it was serving: bring it back

    async def _health(self, inst: Instance, proc: trio.Process) -> None:
        """Kill `proc` once its /health failed HEALTH_FAILS times in a row
        while it was loaded (its supervisor then restarts it)."""
        fails = 0
        # no kept-alive connection: one would hold a child's graceful shutdown
        # (an unload's SIGTERM) open until its grace ran out
        async with httpx.AsyncClient(timeout=HEALTH_S,
                                     limits=httpx.Limits(max_keepalive_connections=0)) as client:
            while proc.returncode is None:
                await trio.sleep(HEALTH_S)
                if inst.process is not proc or inst.status != "loaded":
                    fails = 0
                    continue
                try:
                    ok = (await client.get(inst.base_url + "/health")).status_code == 200
                except httpx.HTTPError:
                    ok = False
                fails = 0 if ok else fails + 1
                if fails >= HEALTH_FAILS:
                    log.warning("%s: its server failed %d health checks in a row (no answer "
                                "to /health within %g s): restarting it", inst.name, fails,
                                HEALTH_S)
                    self._unhealthy.add(proc.pid)
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)  # a stopped process too
                    except (ProcessLookupError, PermissionError):
                        proc.kill()
                    return

    async def _relay(self, inst: Instance, proc: trio.Process) -> None:
        """The child's output, line by line, into the router's log; its
        "model loaded" line marks it ready."""
        assert proc.stdout is not None
        buf = b""
        async for chunk in proc.stdout:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                log.info("[%s] %s", inst.name, line.decode(errors="replace").rstrip())
                if (inst.process is proc and inst.status == "loading"
                        and line.startswith(LOADED_LINE)):
                    self._status(inst, "loaded")
                    inst.ready.set()

    # -- unload ----------------------------------------------------------------

    def stop(self, inst: Instance) -> None:
        """Stop `inst`'s child (it turns "unloaded" once it has exited)."""
        proc = inst.process
        if proc is None or proc.returncode is not None:
            return
        self._stopping.add(proc.pid)
        self._status(inst, "unloaded")  # no new request reaches it
        assert self._nursery is not None
        self._nursery.start_soon(self._terminate, proc)

    @staticmethod
    async def _terminate(proc: trio.Process) -> None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return
        with trio.move_on_after(STOP_GRACE_S):
            await proc.wait()
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        await proc.wait()
