"""One model across several processes with MLX's own distributed engine.

`mlx.launch` starts the same `mlxcel-server` command once per rank (ring
over TCP, JACCL over Thunderbolt RDMA, MPI); each process finds its place in
the world from the environment mlx.launch gives it (`World.from_env`).
Rank 0 serves HTTP and runs the engine as usual; every other rank runs the
engine alone (no socket, no trio), stepping the same batch in lockstep:

- The model is split across the ranks before its weights are read
  (`split_model`): `--split-mode row` (or `tensor`) is tensor parallelism
  through the architecture's mlx-lm `shard` method (every rank holds 1/N of
  each attention and MLP matrix, two all-reduces per layer); `layer` is
  mlx-lm's pipeline (each rank holds a contiguous run of layers, the hidden
  state travels between ranks).  Unset, tensor parallelism is used where the
  architecture has it, else the pipeline, as mlx-lm's own server does.
- At the start of each engine step rank 0 broadcasts one record of what it
  took in since the last one (`Lockstep.lead`): the commands it applied, in
  order (submits, cancellations, slot actions, shutdown), its clock, and a
  digest of its last step's admissions and tokens.  A
  follower (`Lockstep.follow`) applies the same commands to its own
  scheduler and steps; its events are dropped.  The record travels as an
  all_sum of a uint8 buffer (every other rank adds zeros): one fixed-size
  collective per step, a second only for a record over `HEAD_BYTES`.
- Sampling: every sampled token is taken from rank 0 (`share_tokens`: the
  decode batch's next tokens are all-summed with zeros from the others), so
  per-request seeds, unseeded sampling and grammars need not agree across
  ranks; only rank 0 holds a request's grammar.  With tensor parallelism the
  logits are identical on every rank anyway (the all-reduce result is).
- Decisions on time (`t_max_predict_ms`) read one clock on every rank: the
  time rank 0 stamped on the step's record (`Lockstep.clock`).
- Divergence is loud: a follower whose admissions or tokens differ from the
  digest rank 0 sent stops with an error (mlx.launch then stops every rank);
  a rank that loses a peer stops too (the ring backend raises at once).

Nothing here imports trio.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import secrets
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..protocol.records import Job, Started, Submit, TokenPiece

log = logging.getLogger("mlxcel.engine")

TENSOR, PIPELINE = "tensor", "pipeline"
SPLIT_ROW = ("row", "tensor")           # --split-mode values meaning tensor parallelism
HEAD_BYTES = 4096                       # the per-step record's fixed collective
MAX_RECORD_BYTES = 1 << 30              # a record announcing more is garbled
_LEN = struct.Struct("<Q")


_BELL = struct.Struct("<I")             # the doorbell's port, then its token
BELL_SETUP_S = 30.0                     # connecting the doorbells at startup


def _leader_ip(hostfile: str) -> str | None:
    """Rank 0's first address in a ring hostfile (a JSON list, per rank, of
    "ip:port" strings), or None for any other launcher."""
    try:
        hosts = json.loads(Path(hostfile).read_text()) if hostfile else None
        ip = hosts[0][0].rsplit(":", 1)[0].strip("[]")
    except (OSError, ValueError, TypeError, IndexError, KeyError, AttributeError):
        return None
    return ip if isinstance(ip, str) and ip else None


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


class DistributedError(RuntimeError):
    """The ranks can no longer step together (a peer is gone, or diverged)."""


@attrs.frozen
class World:
    rank: int = 0
    size: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> World:
        """This process's place in the world, from what mlx.launch (ring,
        JACCL) or mpirun set; one process of one when started alone."""
        env = os.environ if env is None else env
        size = 1
        if env.get("MLX_WORLD_SIZE"):
            size = int(env["MLX_WORLD_SIZE"])
        elif env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE"):
            size = int(env.get("OMPI_COMM_WORLD_SIZE") or env["PMI_SIZE"])
        else:
            for var in ("MLX_HOSTFILE", "MLX_IBV_DEVICES"):  # ring / JACCL: a JSON file
                path = env.get(var)
                if path:
                    try:
                        text = Path(path).read_text().strip()
                        size = len(json.loads(text)) if text else 1
                    except (OSError, ValueError):
                        size = 1
                    break
        rank = int(env.get("MLX_RANK") or env.get("OMPI_COMM_WORLD_RANK")
                   or env.get("PMI_RANK") or 0)
        return cls(rank, max(size, 1))


def init_group(world: World):
    """Join the world (blocks until every rank has); checked against what
    the environment said."""
    import mlx.core as mx

    group = mx.distributed.init(strict=True)
    if group.size() != world.size or group.rank() != world.rank:
        raise DistributedError(f"mx.distributed joined as rank {group.rank()} of "
                               f"{group.size()}; the launcher said {world.rank} of {world.size}")
    return group


# ---- what can be split, asked before anything loads ---------------------------

def _model_class(path: str):
    from mlx_lm.utils import load_config

    from .mlx_lm_internals import get_classes

    config = load_config(Path(path))
    model_class, args_class = get_classes(config)
    return config, model_class, args_class


def capabilities(path: str) -> tuple[str, set[str], dict]:
    """(model_type, the split kinds mlx-lm offers for it, config), from the
    architecture's classes alone."""
    config, model_class, _ = _model_class(path)
    kinds = set()
    if hasattr(model_class, "shard"):
        kinds.add(TENSOR)
    module = __import__(model_class.__module__, fromlist=["_"])
    if any(hasattr(getattr(module, name), "pipeline") and isinstance(getattr(module, name), type)
           for name in dir(module) if not name.startswith("_")
           and getattr(getattr(module, name), "__module__", None) == module.__name__):
        kinds.add(PIPELINE)
    return str(config.get("model_type", "unknown")), kinds, config


def plan_split(split_mode: str | None, path: str, world: World) -> str:
    """TENSOR or PIPELINE for this checkpoint in this world, or ValueError
    with the option, the value and what to use instead."""
    model_type, kinds, config = capabilities(path)
    if split_mode == "none":
        raise ValueError(f"--split-mode 'none' serves from one process, but the launcher "
                         f"started {world.size}; use --split-mode row (tensor parallel) or "
                         "layer (pipeline), or start one process")
    if split_mode in SPLIT_ROW:
        if TENSOR not in kinds:
            alt = ("use --split-mode layer (pipeline)" if PIPELINE in kinds
                   else "serve it from one process")
            raise ValueError(f"--split-mode {split_mode!r}: mlx-lm has no tensor-parallel "
                             f"sharding for the {model_type} architecture; {alt}")
        kind = TENSOR
    elif split_mode == "layer":
        if PIPELINE not in kinds:
            alt = ("use --split-mode row (tensor parallel)" if TENSOR in kinds
                   else "serve it from one process")
            raise ValueError(f"--split-mode 'layer': mlx-lm has no pipeline split for the "
                             f"{model_type} architecture; {alt}")
        kind = PIPELINE
    elif kinds:
        kind = TENSOR if TENSOR in kinds else PIPELINE
    else:
        raise ValueError(f"the {model_type} architecture cannot be split across processes "
                         "(mlx-lm has neither tensor-parallel sharding nor a pipeline for it); "
                         "serve it from one process")
    if kind == TENSOR:
        text = config.get("text_config", config)
        for key in ("num_attention_heads", "num_key_value_heads"):
            n = text.get(key)
            if isinstance(n, int) and n % world.size:
                raise ValueError(f"--split-mode row: {key} = {n} does not divide among "
                                 f"{world.size} processes; launch a number of processes that "
                                 f"divides it, or use --split-mode layer")
    else:
        n_layers = int(config.get("num_hidden_layers", 0) or 0)
        if n_layers and n_layers < world.size:
            raise ValueError(f"--split-mode layer: {n_layers} layers cannot be shared among "
                             f"{world.size} processes; launch at most {n_layers}")
    return kind


def split_model(model, kind: str, group) -> None:
    """Split the (lazily loaded) model in place, before its weights are read."""
    if kind == TENSOR:
        model.shard(group)
    else:
        model.model.pipeline(group)


# ---- the sampled tokens: rank 0's, everywhere -------------------------------------

_installed: Any = None


def share_tokens(group) -> None:
    """Make every decode step take rank 0's sampled tokens: after mlx-lm's
    GenerationBatch samples, the tokens are all-summed with zeros from every
    other rank (one tiny collective per decode step, lazily in the graph)."""
    global _installed
    import mlx.core as mx
    from mlx_lm.generate import GenerationBatch

    if _installed is not None:
        return
    original = GenerationBatch._step
    mine = group.rank() == 0

    def _step(self):
        out = original(self)
        nxt = self._next_tokens
        self._next_tokens = mx.distributed.all_sum(nxt if mine else mx.zeros_like(nxt),
                                                   group=group)
        mx.async_eval(self._next_tokens)
        return out

    GenerationBatch._step = _step
    _installed = original


# ---- the per-step record -------------------------------------------------------------

def _portable(cmd):
    """The command as a follower needs it: a job without its grammar (the
    sampled tokens come from rank 0) nor its request settings (never read by
    the engine), which are neither needed nor picklable."""
    if isinstance(cmd, Submit) and isinstance(cmd.job, Job):
        return Submit(attrs.evolve(cmd.job, grammar=None, settings=None))
    return cmd


def digest(events) -> bytes:
    """What every rank must agree on after a step: admissions (slot, cached
    prefix) and tokens."""
    h = hashlib.blake2b(digest_size=8)
    for ev in events:
        if isinstance(ev, Started):
            h.update(b"S%d,%d,%d;" % (ev.job_id, ev.id_slot, ev.n_cache))
        elif isinstance(ev, TokenPiece):
            h.update(b"T%d,%d;" % (ev.job_id, ev.token))
    return h.digest()


class Lockstep:
    """The per-step channel between rank 0 and the followers."""

    def __init__(self, group) -> None:
        self.group = group
        self.leader = group.rank() == 0
        self.stamp = 0.0  # rank 0's clock at the current step's record
        # rank 0's doorbell sockets (one per follower), or a follower's one:
        # a follower blocks on it instead of spinning inside the collective
        # while rank 0 has nothing to step (the ring backend polls)
        self._bells: list[socket.socket] = []

    def ring_doorbell(self, env: Mapping[str, str] | None = None) -> bool:
        """Connect rank 0 to every follower over TCP, when the ring
        hostfile names rank 0's address; True when every rank has its bell
        (decided together: either all ring it or none does)."""
        env = os.environ if env is None else env
        size, rank = self.group.size(), self.group.rank()
        if size > 256:  # the vote below counts in one byte per rank
            return False
        host = _leader_ip(env.get("MLX_HOSTFILE", ""))
        server = None
        if self.leader:
            token = secrets.token_bytes(16)
            port = 0
            if host is not None:
                try:
                    server = socket.create_server((host, 0))
                    port = server.getsockname()[1]
                except OSError:
                    server = None
            got = self._broadcast(_BELL.pack(port) + token)
        else:
            got = self._broadcast(None)
        (port,), token = _BELL.unpack_from(got), got[_BELL.size:]
        ok = 0
        if port and not self.leader:
            try:
                bell = socket.create_connection((host, port), timeout=BELL_SETUP_S)
                bell.sendall(token)
                bell.settimeout(None)
                self._bells = [bell]
                ok = 1
            except OSError:
                pass
        if server is not None:
            ok = self._accept_bells(server, token, size - 1)
        votes = self._all_sum_bytes(bytes([ok if i == rank else 0 for i in range(size)]), size)
        on = votes[0] == size - 1 and all(v == 1 for v in votes[1:])
        if not on:
            for bell in self._bells:
                bell.close()
            self._bells = []
        return on

    def _accept_bells(self, server: socket.socket, token: bytes, n: int) -> int:
        server.settimeout(BELL_SETUP_S)
        try:
            while len(self._bells) < n:
                conn, _ = server.accept()
                conn.settimeout(BELL_SETUP_S)
                if _recv_exactly(conn, len(token)) == token:
                    conn.settimeout(None)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._bells.append(conn)
                else:  # not one of ours
                    conn.close()
        except OSError:
            pass
        finally:
            server.close()
        return len(self._bells)

    def clock(self) -> float:
        """The schedulers' decision clock: the same value on every rank."""
        return self.stamp

    def _all_sum_bytes(self, data: bytes | None, n: int) -> bytes:
        import mlx.core as mx
        import numpy as np
        from mlx_lm.generate import generation_stream

        # on the generator's stream: collectives pair up across ranks in the
        # order each rank runs them, and a decode step may still have its
        # next token's all_sum queued there
        with mx.stream(generation_stream):
            buf = (mx.array(np.frombuffer(data.ljust(n, b"\0"), dtype=np.uint8))
                   if data is not None else mx.zeros((n,), dtype=mx.uint8))
            try:
                out = mx.distributed.all_sum(buf, group=self.group)
                mx.eval(out)
            except RuntimeError as exc:
                raise DistributedError(f"lost the other ranks: {exc}") from None
        return bytes(memoryview(out))

    def _broadcast(self, payload: bytes | None) -> bytes:
        room = HEAD_BYTES - _LEN.size
        head = None if payload is None else _LEN.pack(len(payload)) + payload[:room]
        got = self._all_sum_bytes(head, HEAD_BYTES)
        (n,) = _LEN.unpack_from(got)
        if n > MAX_RECORD_BYTES:
            raise DistributedError(f"a garbled step record ({n} bytes announced)")
        body = got[_LEN.size:_LEN.size + min(n, room)]
        if n > room:
            body += self._all_sum_bytes(None if payload is None else payload[room:], n - room)
        return body

    def lead(self, commands: list, events) -> None:
        """Rank 0, before each step: the commands it applied since the last
        step, and what that step produced (`events`)."""
        self.stamp = time.perf_counter()
        record = ([_portable(c) for c in commands], digest(events), self.stamp)
        for bell in self._bells:
            try:
                bell.sendall(b"\1")
            except OSError as exc:
                raise DistributedError(f"lost the other ranks: {exc}") from None
        self._broadcast(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))

    def follow(self, events) -> list:
        """A follower, before each step: rank 0's commands; `events` are this
        rank's from the last step, checked against rank 0's."""
        if self._bells:
            try:
                rung = self._bells[0].recv(1)
            except OSError:
                rung = b""
            if not rung:
                raise DistributedError("lost rank 0 (its doorbell closed)")
        commands, theirs, self.stamp = pickle.loads(self._broadcast(None))
        if digest(events) != theirs:
            raise DistributedError("this rank's admissions or tokens differ from rank 0's; "
                                   "the ranks diverged")
        return commands




def plan(cfg, world: World) -> str:
    """How this server splits its model among `world`'s ranks (TENSOR or
    PIPELINE), or ValueError naming the option that cannot be served so,
    its value and what to do instead; asked before anything loads."""
    refused = (
        (cfg.router, "router mode (--models-dir / --models-preset)",
         "launch one model per mlx.launch"),
        (cfg.spec_model is not None, f"-md {cfg.spec_model!r}",
         "drop the draft model (speculative decoding runs on one process)"),
        (bool(cfg.adapters), "--lora", "merge the adapter into the checkpoint first"),
        (cfg.encoder_mode is not None, str(cfg.encoder_mode),
         "serve the encoder from one process"),
        (cfg.embedding_model is not None, "--embedding-model",
         "serve the encoder from its own process"),
        (cfg.reranker_model is not None, "--reranker-model",
         "serve the encoder from its own process"),
        (cfg.sleep_idle_seconds >= 0, f"--sleep-idle-seconds {cfg.sleep_idle_seconds}",
         "drop it (every rank would have to sleep and wake together)"),
    )
    for given, what, instead in refused:
        if given:
            raise ValueError(f"{what} cannot be served across {world.size} processes "
                             f"(mlx.launch); {instead}")
    media = _media_checkpoint(cfg.model)
    if media is not None:
        raise ValueError(f"-m names {media}, which cannot be served across {world.size} "
                         "processes (mlx.launch): only a text model is split among ranks; "
                         "serve it from one process")
    return plan_split(cfg.split_mode, cfg.model, world)


def _media_checkpoint(path: str) -> str | None:
    """What kind of non-text checkpoint `path` is (a Whisper model, a
    vision-language model, a chat model with an audio tower), or None for a
    text model."""
    import json

    from .stt.transcriber import is_whisper
    from .towers.vlm_config import is_vlm

    if is_whisper(path):
        return "a Whisper (speech-to-text) checkpoint"
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    from .audio_chat import is_audio_chat

    if is_audio_chat(config):
        return "a chat checkpoint with an audio tower"
    return "a vision-language checkpoint" if is_vlm(config) else None
