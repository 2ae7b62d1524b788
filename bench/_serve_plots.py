"""PNG plots of bench/serve.py's summaries, one file per metric.

matplotlib is optional (`pip install -e '.[bench]'`); without it serve.py
says so and prints its table only.  The summaries come straight from a run
or from the JSON a run wrote (`--json`), where percentile keys are strings.

Each latency figure has three panels: against the Poisson request rate,
against the closed-loop concurrency, and the multi-turn workload, with p50
as a solid line and p90 / p99 dashed and dotted in the same colour.  The
throughput figure shows output tokens/s, requests/s and goodput the same way.
"""

from __future__ import annotations

from pathlib import Path

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "end-to-end latency"))
RATES = (("tok_s", "output tokens/s"), ("req_s", "requests/s"), ("goodput", "goodput, req/s"))
STYLE = {50: "-", 90: "--", 99: ":"}


def _pick(s: dict, metric: str, q: int | None) -> float | None:
    if q is None:
        return s.get(metric)
    per = s.get(metric) or {}
    v = per.get(q, per.get(str(q)))
    return None if v is None else v * 1e3


def _series(per: dict[str, dict], prefix: str) -> list[tuple[float, dict]]:
    out = [(float(wl.split("=", 1)[1]), s) for wl, s in per.items()
           if wl.startswith(prefix) and "error" not in s]
    return sorted(out, key=lambda p: p[0])


def _figure(results: dict[str, dict[str, dict]], title: str, lines: list[tuple[str, int | None]],
            unit: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), gridspec_kw={"width_ratios": [3, 3, 2]})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    systems = list(results)
    for i, system in enumerate(systems):
        c = colours[i % len(colours)]
        for ax, prefix in ((axes[0], "rate="), (axes[1], "conc=")):
            pts = _series(results[system], prefix)
            for metric, q in lines:
                xs = [x for x, s in pts if _pick(s, metric, q) is not None]
                ys = [_pick(s, metric, q) for _, s in pts if _pick(s, metric, q) is not None]
                if xs:
                    ax.plot(xs, ys, STYLE.get(q, "-"), marker="o", color=c,
                            label=f"{system}" + (f" p{q}" if q else ""))
        mt = results[system].get("multiturn")
        if mt and "error" not in mt:
            for j, (metric, q) in enumerate(lines):
                v = _pick(mt, metric, q)
                if v is not None:
                    w = 0.8 / len(systems)
                    axes[2].bar(j + i * w, v, w, color=c, alpha=1.0 - 0.25 * j,
                                label=system if j == 0 else None)
    axes[0].set_xlabel("Poisson request rate, req/s")
    axes[1].set_xlabel("concurrency (closed loop)")
    axes[2].set_xticks([j + 0.4 - 0.4 / max(1, len(systems)) for j in range(len(lines))])
    axes[2].set_xticklabels([f"p{q}" if q else m for m, q in lines])
    axes[2].set_xlabel("multi-turn conversations")
    for ax in axes:
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write(results: dict[str, dict[str, dict]], out_dir: Path, note: str = "") -> list[Path]:
    """One PNG per latency metric and one for throughput; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = f" ({note})" if note else ""
    paths = [_figure(results, f"{label}{suffix}", [(key, q) for q in (50, 90, 99)], "ms",
                     out_dir / f"serve-{key}.png") for key, label in LATENCIES]
    paths += [_figure(results, f"{label}{suffix}", [(key, None)], label,
                      out_dir / f"serve-{key}.png") for key, label in RATES]
    return paths


def available() -> str | None:
    """None when plots can be drawn, else why not."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'); no plots"
    return None
