"""Checkpoint forms: one checkpoint in float32, bf16 and 4-bit, served by
mlxcel out of the box, by raw mlx-lm and by mlx_lm.server.  A benchmark, not
a test: it prints numbers, ratios and the issue's targets, never fails on them.

    python bench/forms.py                                  # bench fixture forms
    python bench/forms.py --fixture tiny --tokens 8        # smoke run, ~1 minute
    python bench/forms.py --model float32=DIR --model bf16=DIR --model 4bit=DIR
    python bench/forms.py ... --llama-server BIN --gguf [FORM=]FILE --json OUT.json

Systems, each in its own process, one after the other:

- mlxcel out of the box: `python -m mlxcel_trio -m FORM -np 8` in a clean
  environment (no LD_PRELOAD, no MLXCEL_* or BLAS threading variables): the
  BLAS and the weight policy it picks by itself (its startup lines are
  printed);
- raw mlx-lm as a user runs it: bench/_raw.py on the form as stored, clean
  environment (so the mlx wheel's bundled BLAS);
- raw mlx-lm tuned by hand: bench/_raw.py on the float32 form with the BLAS
  the server would pick preloaded (`_common.blas_env("auto")`), measured once:
  the reference every target is a ratio of;
- mlx_lm.server as a user runs it (clean environment), streaming
  /v1/completions (its EOS banned by the `logit_bias` every server gets:
  _common.banned_ids);
- llama-server (optional, `--llama-server BIN --gguf FILE`), /completion.

Measured per system and form: decode tok/s for 1 stream and for the
`--streams` levels (client-side frame times; aggregate rates over the window
in which every stream decodes), prefill tok/s and TTFT of one request with a
`--prompt-tokens` prompt (which is also the single-stream request), and the
process's peak RSS (VmHWM).  See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import _common as C  # noqa: E402

FORMS = ("float32", "bf16", "4bit")
FIXTURES = {"bench": {"float32": "bench", "bf16": "bench-bf16", "4bit": "bench-4bit"},
            "tiny": {"float32": "tiny", "bf16": "tiny-bf16", "4bit": "tiny-4bit"}}
SYSTEMS = ("mlxcel", "raw", "mlx_lm.server", "llama-server")   # per form; "tuned" once
LABEL = {"mlxcel": "mlxcel out of the box", "raw": "raw mlx-lm as stored, no preload",
         "tuned": "raw mlx-lm tuned by hand (float32 + BLAS)", "mlx_lm.server": "mlx_lm.server",
         "llama-server": "llama-server"}
# The float32 form with the wheel's bundled BLAS runs ~40x slower than with
# MKL/OpenBLAS: minutes per phase on the bench fixture, and no target uses it.
DEFAULT_SKIP = "float32:raw,float32:mlx_lm.server"
TARGETS = {"vs_ref": 0.90, "vs_mlx_lm": {"bf16": 2.4, "4bit": 10.0}, "memory": 1.15}
TIMEOUT = httpx.Timeout(3600, connect=30)


def clean_env() -> dict[str, str]:
    """What a user's shell gives: no preload, no MLXCEL_* or BLAS knobs."""
    env = {k: v for k, v in os.environ.items()
           if k not in C.BLAS_ENV and not k.startswith("MLXCEL_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def tuned_env() -> dict[str, str]:
    env = C.blas_env("auto")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- prompts -------------------------------------------------------------------

class Prompts:
    """Token-id prompts whose text tokenizes back to the same ids, so the text
    sent to mlx_lm.server (its /v1/completions takes text only) is the
    prompt the others get as ids.  Drawn from the tokens that are one space
    plus letters and encode to themselves: a sequence of those splits back
    into the same tokens (the byte-level pre-tokenizer cuts before each
    space); all ordinary ids when there are too few such tokens."""

    def __init__(self, model: Path, args) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        ids = C.vocab_ids(model)
        word = re.compile(r"^ [A-Za-z]{2,}$")
        words = [i for i in ids if word.match(self.tok.decode([i]))
                 and self.tok.encode(self.tok.decode([i]), add_special_tokens=False).ids == [i]]
        self.pool = words if len(words) >= 64 else ids
        self.round_trip = True

        def make(n, seed):
            p = C.make_prompt(self.pool, n, seed)
            if self.tok.encode(self.tok.decode(p), add_special_tokens=False).ids != p:
                self.round_trip = False
            return p

        self.warmup = make(args.stream_prompt_tokens, 999)
        self.single = make(args.prompt_tokens, 0)
        self.batch = {str(n): [make(args.stream_prompt_tokens, 100 * n + i) for i in range(n)]
                      for n in args.streams}

    def text(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


# -- clients -------------------------------------------------------------------

def stream_llama(url: str, prompt, n: int, client: httpx.Client, barrier=None,
                 bias: dict | None = None) -> dict:
    """One streaming /completion (mlxcel, llama-server); events are
    (seconds since send, tokens so far)."""
    run = C.stream_completion(url, prompt, n, client, barrier,
                              {"logit_bias": bias} if bias else None)
    final, events = run["final"], run["events"]
    timings = (final or {}).get("timings") or {}
    return {"t_send": run["t_send"], "events": events, "prompt_n": timings.get("prompt_n"),
            "timings": timings, "stopped_early": bool(final and final.get("stop_type") == "eos"),
            "generated": (final or {}).get("tokens_predicted", events[-1][1] if events else 0)}


def stream_oai(url: str, prompt: str, n: int, client: httpx.Client, barrier=None,
               bias: dict | None = None) -> dict:
    """One streaming /v1/completions (mlx_lm.server).  It streams one frame
    per token whose text is not empty, without token ids, so frames count
    the tokens; the usage frame says how many there really were."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if bias:
        body["logit_bias"] = bias
    if barrier is not None:
        barrier.wait()
    events, usage, finish = [], None, None
    t_send = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            obj = json.loads(line[6:])
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices") or []:
                if ch.get("text"):
                    events.append((now - t_send, len(events) + 1))
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
    usage = usage or {}
    generated, frames = usage.get("completion_tokens"), len(events)
    if generated and frames and generated != frames:
        # Some frames carried several tokens (text held back mid-UTF-8 or
        # empty): spread the real count over the frames.
        events = [(t, round(generated * k / frames)) for t, (_, k) in
                  zip([e[0] for e in events], events)]
    return {"t_send": t_send, "events": events, "prompt_n": usage.get("prompt_tokens"),
            "generated": generated, "frames": frames, "finish_reason": finish,
            "stopped_early": finish == "stop"}


def concurrent(fn, prompts: list) -> dict:
    """fn(prompt, client, barrier) for every prompt at once, released together."""
    barrier = threading.Barrier(len(prompts))
    results: list = [None] * len(prompts)
    clients = [httpx.Client(timeout=TIMEOUT) for _ in prompts]

    def run(i):
        try:
            results[i] = fn(prompts[i], clients[i], barrier)
        except Exception as exc:  # reported, not raised: a benchmark never fails
            results[i] = {"error": repr(exc), "events": [], "t_send": time.perf_counter()}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    origin = min(r["t_send"] for r in results)
    return {"streams": [[(r["t_send"] - origin + t, n) for t, n in r["events"]] for r in results],
            "errors": [r["error"] for r in results if "error" in r],
            "generated": [r.get("generated") for r in results],
            "frames": [r.get("frames") for r in results],
            "stopped_early": sum(bool(r.get("stopped_early")) for r in results),
            "wall_s": time.perf_counter() - t0}


# -- processes -----------------------------------------------------------------

class Proc:
    """A server process on 127.0.0.1, stdout and stderr in one log file."""

    def __init__(self, argv: list[str], env: dict, port: int, log: Path) -> None:
        self.argv, self.env, self.port, self.log = argv, env, port, log
        self.url = f"http://127.0.0.1:{port}"

    def start(self, timeout: float) -> Proc:
        self.t0 = time.perf_counter()
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=self._out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"not ready in {timeout:.0f} s: {self.tail()}")

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        C.stop_process(getattr(self, "proc", None))
        if getattr(self, "_out", None):
            self._out.close()


def startup_lines(log: str) -> list[str]:
    """The server's own words about its BLAS and its weights."""
    keep = re.compile(r"BLAS|weights (converted|kept)|--weights")
    return [l.strip() for l in log.splitlines() if keep.search(l)][:6]


def measure_server(system: str, model: Path, env: dict, prompts: Prompts, args, log_dir: Path,
                   banned: list[int]) -> dict:
    port = C.free_port()
    n_slots = max([8, *args.streams])
    if system == "mlxcel":
        argv = [sys.executable, "-m", "mlxcel_trio", "-m", str(model), "-np", str(n_slots),
                "--host", "127.0.0.1", "--port", str(port)]
    elif system == "llama-server":
        ctx = n_slots * (max(args.prompt_tokens, args.stream_prompt_tokens) + args.tokens + 64)
        argv = [args.llama_server, "-m", str(model), "-np", str(n_slots), "-c", str(ctx),
                "--host", "127.0.0.1", "--port", str(port)]
    else:
        argv = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model),
                "--host", "127.0.0.1", "--port", str(port)]
    srv = Proc(argv, env, port, log_dir / f"{system}-{port}.log")
    out: dict = {"argv": argv}
    try:
        srv.start(args.start_timeout)
        bias = {str(t): -100 for t in banned}
        if system == "mlx_lm.server":
            def one(p, client, barrier=None, n=args.tokens):
                return stream_oai(srv.url, prompts.text(p), n, client, barrier, bias)
        else:
            def one(p, client, barrier=None, n=args.tokens):
                return stream_llama(srv.url, p, n, client, barrier, bias)
        with httpx.Client(timeout=TIMEOUT) as client:
            one(prompts.warmup, client, n=2)  # mlx_lm.server loads the model here
            out["load_s"] = time.perf_counter() - srv.t0
            out["single"] = one(prompts.single, client)
        out["batch"] = {k: concurrent(one, ps) for k, ps in prompts.batch.items()}
        out["memory_kib"] = C.proc_status(srv.proc.pid)
        out["blas"] = C.blas_in_use(srv.proc.pid)
    except Exception as exc:
        out["error"] = f"{exc!r}"[:2000]
    finally:
        srv.stop()
        out["startup"] = startup_lines(srv.log.read_text(errors="replace"))
    return out


def measure_raw(model: Path, env: dict, prompts: Prompts, args, log_dir: Path, tag: str) -> dict:
    spec = {"model": str(model), "tokens": args.tokens, "eos": "ban",
            "warmup_prompt": prompts.warmup, "single_prompt": prompts.single,
            "batch_prompts": prompts.batch}
    path = log_dir / f"raw-{tag}.json"
    path.write_text(json.dumps(spec))
    try:
        p = subprocess.run([sys.executable, str(HERE / "_raw.py"), str(path)], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=args.raw_timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.raw_timeout} s"}
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"error": f"rc {p.returncode}: {(p.stdout + p.stderr)[-1500:]}"}
    r = json.loads(lines[-1][7:])
    r["single"]["prompt_n"] = len(prompts.single)
    r["batch"] = {k: {"streams": v["events"], "wall_s": v["wall_s"], "errors": [],
                      "generated": [len(t) for t in v["tokens"]], "stopped_early": 0}
                  for k, v in r["batch"].items()}
    r["single"]["generated"] = len(r["single"]["tokens"])
    r["memory_kib"] = r["memory_kib"]["end"]
    return r


# -- analysis ------------------------------------------------------------------

def summarize(m: dict, streams: list[int]) -> dict:
    """The numbers the tables show, from one system's raw measurements."""
    if not m or "error" in m or "single" not in m:
        return {}
    s: dict = {}
    ev = m["single"]["events"]
    s["dec1"] = C.single_rate(ev)
    s["ttft"] = ev[0][0] if ev else None
    n = m["single"].get("prompt_n")
    s["prompt_n"] = n
    s["prefill"] = n / s["ttft"] if n and s["ttft"] else None
    t = m["single"].get("timings") or {}
    s["prefill_srv"] = t.get("prompt_per_second")
    s["no_overlap"], s["frames_short"] = [], 0
    for k in streams:
        b = m["batch"].get(str(k)) or {}
        st = [x for x in b.get("streams") or [] if x]
        s[f"dec{k}"] = C.aggregate_rate(st).get("rate")
        if st and max(x[0][0] for x in st) >= min(x[-1][0] for x in st):
            s["no_overlap"].append(k)   # the rate is then end-to-end, prefill included
        s["frames_short"] += sum(1 for f, g in zip(b.get("frames") or [], b.get("generated") or [])
                                 if f is not None and g and f < g)
    if m["single"].get("frames") is not None and m["single"]["frames"] < (m["single"].get("generated") or 0):
        s["frames_short"] += 1
    s["hwm_mib"] = m["memory_kib"]["VmHWM"] / 1024 if m.get("memory_kib") else None
    early = [m["single"].get("stopped_early")] + [b.get("stopped_early")
                                                  for b in m["batch"].values()]
    s["stopped_early"] = sum(bool(e) for e in early)
    s["generated"] = [m["single"].get("generated")] + [g for b in m["batch"].values()
                                                       for g in b.get("generated", [])]
    s["errors"] = [e for b in m["batch"].values() for e in b.get("errors", [])]
    return s


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def verdict(r, target, higher=True) -> str:
    if r is None:
        return "n/a"
    return "MET" if (r >= target if higher else r <= target) else "MISSED"


def print_form(form: str, model: Path, rows: dict, ref: dict, args) -> None:
    cols = [("dec1", "1 stream"), *[(f"dec{k}", f"{k} streams") for k in args.streams],
            ("prefill", "prefill"), ("ttft", "TTFT ms"), ("hwm_mib", "RSS MiB")]
    print("=" * 100)
    print(f"form {form}: {model}")
    print("decode and prefill in tok/s (client-side frame times; prefill = prompt tokens / TTFT); "
          "ratios: higher is better except TTFT and RSS")
    print(f"{'system':44}"
          + "".join(f"{c[1]:>10}" for c in cols))
    mlx_srv = rows.get("mlx_lm.server") or {}
    for system, s in rows.items():
        if s is None:
            continue
        if not s:
            print(f"{LABEL[system]:44} (failed, see the log above)")
            continue

        def cell(key, val):
            if val is None:
                return f"{'-':>10}"
            return f"{val * 1e3 if key == 'ttft' else val:>10.{0 if key in ('ttft', 'hwm_mib') else 2}f}"
        print(f"{LABEL[system]:44}" + "".join(cell(k, s.get(k)) for k, _ in cols))
        for name, base in (("  x tuned raw mlx-lm (float32 + BLAS)", ref),
                           ("  x mlx_lm.server", mlx_srv)):
            if system == "tuned" and base is ref or system == "mlx_lm.server" and base is mlx_srv \
                    or not base:
                continue
            print(f"{name:44}" + "".join(f"{fmt(ratio(s.get(k), base.get(k)), '.2f', 'x'):>10}"
                                         for k, _ in cols))
        notes = []
        if s.get("prefill_srv"):
            notes.append(f"server timings prefill {s['prefill_srv']:.1f} tok/s")
        if s.get("prompt_n"):
            notes.append(f"prompt {s['prompt_n']} tokens")
        if s.get("stopped_early"):
            notes.append(f"STOPPED EARLY in {s['stopped_early']} request(s)")
        want = args.tokens
        short = [g for g in s.get("generated", []) if g is not None and g < want]
        if short:
            notes.append(f"{len(short)} stream(s) generated fewer than {want} tokens: {short}")
        if s.get("no_overlap"):
            notes.append(f"{'/'.join(map(str, s['no_overlap']))} streams never all decoded at once "
                         "(one started after another ended): end-to-end rate shown")
        if s.get("frames_short"):
            notes.append(f"{s['frames_short']} stream(s) sent fewer frames than tokens: "
                         "token counts spread over the frames")
        if s.get("errors"):
            notes.append(f"errors {s['errors'][:2]}")
        if notes:
            print(f"{'':44}({'; '.join(notes)})")


def print_summary(sums: dict, ref: dict, args) -> list[dict]:
    print("=" * 100)
    print("targets (mlxcel out of the box; reference = raw mlx-lm tuned by hand, float32 + the "
          "server's BLAS):")
    checks = []
    top = f"dec{max(args.streams)}" if args.streams else None

    def check(label, r, target, higher=True):
        checks.append({"check": label, "ratio": r, "target": target,
                       "verdict": verdict(r, target, higher)})
        sign = ">=" if higher else "<="
        print(f"  {label:58} {fmt(r, '.2f', 'x'):>8}  {sign} {target:.2f}x  "
              f"{verdict(r, target, higher)}")

    for form in FORMS:
        rows = sums.get(form)
        if not rows:
            continue
        me = rows.get("mlxcel") or {}
        info = " (info)" if form == "float32" else ""
        for key, what in (("dec1", "single stream"), (top, f"{max(args.streams)} streams")):
            if key:
                check(f"{form}: decode {what} vs reference{info}",
                      ratio(me.get(key), ref.get(key)), TARGETS["vs_ref"])
        if form in TARGETS["vs_mlx_lm"]:
            srv = rows.get("mlx_lm.server") or {}
            for key, what in (("dec1", "single stream"), (top, f"{max(args.streams)} streams")):
                if key:
                    check(f"{form}: decode {what} vs mlx_lm.server",
                          ratio(me.get(key), srv.get(key)), TARGETS["vs_mlx_lm"][form])
        check(f"{form}: peak RSS vs reference (both float32 in memory)",
              ratio(me.get("hwm_mib"), ref.get("hwm_mib")), TARGETS["memory"], higher=False)
    return checks


# -- main ----------------------------------------------------------------------

def parse_models(args) -> dict[str, Path]:
    if args.model:
        models = {}
        for item in args.model:
            form, _, path = item.partition("=")
            if form not in FORMS or not path:
                sys.exit(f"--model {item}: expected FORM=DIR with FORM in {FORMS}")
            models[form] = Path(path).resolve()
        if "float32" not in models:
            sys.exit("--model float32=DIR is required: the reference runs on it")
        return models
    from fixtures.build import ensure

    models = {}
    for form in FORMS:
        kind = FIXTURES[args.fixture][form]
        t0 = time.perf_counter()
        print(f"fixture {kind}: ensuring (a first build can take minutes) ...", end=" ", flush=True)
        models[form] = ensure(kind)
        print(f"{time.perf_counter() - t0:.1f} s", flush=True)
    return models


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", choices=sorted(FIXTURES), default="bench",
                    help="fixture forms to build and measure (bench)")
    ap.add_argument("--model", action="append", metavar="FORM=DIR",
                    help="measure these checkpoints instead (FORM: float32, bf16, 4bit; "
                         "float32 required)")
    ap.add_argument("--tokens", type=int, default=8, help="generated tokens per stream (8)")
    ap.add_argument("--prompt-tokens", type=int, default=64,
                    help="prompt of the single-stream request, which measures prefill (64)")
    ap.add_argument("--stream-prompt-tokens", type=int, default=8,
                    help="prompt of each concurrent stream (8)")
    ap.add_argument("--streams", default="4,8", help="concurrency levels (4,8)")
    ap.add_argument("--skip", default=DEFAULT_SKIP,
                    help=f"FORM:SYSTEM pairs not to measure ({DEFAULT_SKIP}; '' measures all); "
                         f"systems: {', '.join(SYSTEMS[:3])}")
    ap.add_argument("--llama-server", help="llama-server binary (optional)")
    ap.add_argument("--gguf", action="append", default=[], metavar="[FORM=]FILE",
                    help="GGUF for llama-server; a bare FILE is measured once and shown "
                         "with every form")
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--raw-timeout", type=float, default=3600)
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    args = ap.parse_args(argv)
    args.streams = [int(x) for x in str(args.streams).split(",") if x.strip()]
    skip = {tuple(x.split(":", 1)) for x in args.skip.split(",") if ":" in x}
    if bool(args.llama_server) != bool(args.gguf):
        sys.exit("--llama-server and --gguf go together")

    t_all = time.perf_counter()
    models = parse_models(args)
    prompts = Prompts(models["float32"], args)
    eos = C.eos_ids(models["float32"])
    banned = C.banned_ids(models["float32"])
    clean, tuned = clean_env(), tuned_env()
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])} on "
          f"{os.cpu_count()} CPUs; {args.tokens} tokens/stream; prefill prompt "
          f"{len(prompts.single)} tokens, stream prompts {args.stream_prompt_tokens}; "
          f"EOS {eos} ignored; {len(banned)} ids (EOS, added tokens, tokens that are not whole "
          "UTF-8) banned by the same logit_bias for every server")
    if not prompts.round_trip:
        print("warning: prompt text does not tokenize back to the same ids; mlx_lm.server's "
              "prompt lengths differ (its prompt_n is shown)")
    print(f"tuned environment: {C.blas_vars(tuned)}")
    raw: dict = {"models": {k: str(v) for k, v in models.items()}, "measured": {}}
    phases: list = []

    def phase(name, fn):
        t0 = time.perf_counter()
        print(f"{name} ...", end=" ", flush=True)
        r = fn()
        dt = time.perf_counter() - t0
        phases.append((name, dt))
        print(f"{dt:.1f} s{'  FAILED: ' + r['error'][:400] if r.get('error') else ''}", flush=True)
        return r

    with tempfile.TemporaryDirectory(prefix="mlxcel-forms-") as tmp:
        log_dir = Path(tmp)
        m = raw["measured"]
        m["tuned"] = phase("reference: raw mlx-lm, float32 + the server's BLAS",
                           lambda: measure_raw(models["float32"], tuned, prompts, args, log_dir,
                                               "tuned"))
        ggufs = [g.partition("=") if "=" in g else ("", "", g) for g in args.gguf]
        for form in FORMS:
            if form not in models:
                continue
            m[form] = {}
            for system in SYSTEMS[:3]:
                if (form, system) in skip:
                    continue
                name = f"{form}: {LABEL[system]}"
                if system == "raw":
                    r = phase(name, lambda f=form: measure_raw(models[f], clean, prompts, args,
                                                               log_dir, f))
                else:
                    r = phase(name, lambda f=form, s=system: measure_server(
                        s, models[f], clean, prompts, args, log_dir, banned))
                m[form][system] = r
                for line in r.get("startup", []) if system == "mlxcel" else []:
                    print(f"    {line}")
                if r.get("blas"):
                    print(f"    BLAS mapped: {r['blas']['kind']}")
        for gform, _, path in ggufs:
            key = f"llama-server:{gform or 'any'}"
            m[key] = phase(f"{LABEL['llama-server']} {path}",
                           lambda p=path: measure_server("llama-server", Path(p), clean, prompts,
                                                         args, log_dir, banned))

    sums: dict = {}
    ref = summarize(m["tuned"], args.streams)
    if m["tuned"].get("blas"):
        print(f"reference BLAS: {m['tuned']['blas']['kind']}")
    for form in FORMS:
        if form not in m:
            continue
        rows = {"mlxcel": summarize(m[form].get("mlxcel"), args.streams) if "mlxcel" in m[form]
                else None,
                "raw": summarize(m[form].get("raw"), args.streams) if "raw" in m[form] else None,
                "tuned": ref,
                "mlx_lm.server": (summarize(m[form].get("mlx_lm.server"), args.streams)
                                  if "mlx_lm.server" in m[form] else None)}
        for key, val in m.items():
            if key.startswith("llama-server:") and key.split(":")[1] in (form, "any"):
                rows["llama-server"] = summarize(val, args.streams)
        sums[form] = rows
        print_form(form, models[form], rows, ref, args)
    checks = print_summary(sums, ref, args)
    print("-" * 100)
    print("elapsed per phase: " + "; ".join(f"{n} {dt:.0f} s" for n, dt in phases))
    print(f"total {time.perf_counter() - t_all:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "tuned_env": C.blas_vars(tuned), **raw,
                                         "summaries": sums, "targets": checks,
                                         "phases": phases}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
