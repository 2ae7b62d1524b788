"""mlxcel-trio's own runtime choices, which llama-server has no words for:
the BLAS MLX multiplies float32 with on a Linux CPU (--blas; see
mlxcel_trio/blas.py), the CPU weight policy (--weights; see
mlxcel_trio/engine/weights.py) and the session store replicas share
(--session-store; see mlxcel_trio/server/sessions/shared.py)."""

from __future__ import annotations

from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.values import Choice, Text

PERF_ISSUE = 14
SESSIONS_ISSUE = 6

RUNTIME: tuple[Option, ...] = (
    Option(("--blas",), "blas",
           "mlxcel-trio: the BLAS for float32 matmul on a Linux CPU: auto (preload the "
           "system's OpenBLAS when found), bundled (the mlx wheel's single-threaded "
           "reference BLAS), or the path of a library that provides cblas_sgemm",
           value=Text(), metavar="{auto,bundled,PATH}", default="auto", env="MLXCEL_BLAS",
           upstream=False, owner=PERF_ISSUE),
    Option(("--weights",), "weights",
           "mlxcel-trio: how bf16/f16/quantized weights are served on a CPU: auto (as "
           "stored on the native CPU kernels, built at first use, when measured faster "
           "than float32; else in float32 when measured faster here and it fits in "
           "memory), keep (as stored, on the native kernels when they load; "
           "MLXCEL_NATIVE=0 turns them off), float32 (always converted at load)",
           value=Choice(("auto", "keep", "float32")), metavar="{auto,keep,float32}",
           default="auto", env="MLXCEL_WEIGHTS", upstream=False, owner=PERF_ISSUE),
    Option(("--session-store",), "session_store",
           "mlxcel-trio: where resumable streams (X-Conversation-Id), stored responses and "
           "control entries live: memory (this process), file://DIR (this server's "
           "streams on local disk: a restarted server continues them), or a Valkey/Redis "
           "URL (redis://[:PASSWORD@]HOST:PORT/DB, rediss:// for TLS) shared by every replica "
           "behind a load balancer; the password is never logged",
           value=Text(), metavar="{memory,file://DIR,URL}", default="memory",
           env="MLXCEL_SESSION_STORE", secret=True, upstream=False, owner=SESSIONS_ISSUE),
)
