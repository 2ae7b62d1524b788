"""GET /metrics: upstream's `llamacpp:` families, then ours (`mlxcel_`).

The `llamacpp:` block is written line for line as llama-server writes it
(server_task_result_metrics::to_metrics): the same names, HELP texts, types
and order, so a scrape config or dashboard built for llama-server finds every
series.  It is rendered here rather than through prometheus-client's
exposition because one of upstream's counters, `llamacpp:n_tokens_max`, has no
`_total` suffix, and prometheus-client renames counter families to end in
`_total` (its HELP/TYPE lines would no longer name the series).  Our own
families follow, built and rendered by prometheus-client.

Semantics (see monitor.py): counters are cumulative since start; the two
throughput gauges are averaged over the window since the previous scrape
(each scrape resets it, as upstream's does); requests_processing and
requests_deferred are live; n_busy_slots_per_decode is the busy-slot sum over
engine steps divided by the steps.  Speculative counters are 0: no draft
model runs here.  Every value is read from the bridge's monitor (the engine's
own counters included, as its EngineStats events left them), so a sleeping
server answers without waking and nothing is read across threads.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.utils import floatToGoString
from quart import Response

from ...bridge import Bridge
from ...protocol.records import CacheStats, MlxMemory
from ..http.watchdog import RequestWatchdog
from ..http.errors import not_supported

CONTENT_TYPE = "text/plain; version=0.0.4"

# upstream's (name, HELP) pairs, in its order
COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("n_decode_total", "Total number of llama_decode() calls, excluding speculative "
                       "decoding and multimodal decoding"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total",
     "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
GAUGES = (
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
)
UPSTREAM_FAMILIES = tuple(f"llamacpp:{name}" for name, _ in COUNTERS + GAUGES)


def upstream_values(bridge: Bridge) -> dict[str, float]:
    monitor = bridge.monitor
    c = monitor.counters
    n_decode, n_busy = c.n_decode, c.n_busy_slots
    prompt_rate, predict_rate = monitor.take_windows()
    return {
        "prompt_tokens_total": c.prompt.count,
        "prompt_tokens_cached_total": c.n_prompt_cached,
        "prompt_seconds_total": c.prompt.seconds,
        "tokens_predicted_total": c.predict.count,
        "tokens_predicted_seconds_total": c.predict.seconds,
        "n_decode_total": n_decode,
        "n_tokens_max": monitor.n_tokens_max(),
        "spec_decode_num_draft_tokens_total": c.n_draft,
        "spec_decode_num_accepted_tokens_total": c.n_draft_accepted,
        "spec_decode_num_drafts_total": c.n_draft_rounds,
        "prompt_tokens_seconds": prompt_rate,
        "predicted_tokens_seconds": predict_rate,
        "requests_processing": monitor.n_processing,
        "requests_deferred": len(monitor.queued),
        "n_busy_slots_per_decode": n_busy / max(n_decode, 1),
    }


def _upstream_block(values: dict[str, float]) -> str:
    lines = []
    for kind, items in (("counter", COUNTERS), ("gauge", GAUGES)):
        for name, help_text in items:
            full = f"llamacpp:{name}"
            lines += (f"# HELP {full} {help_text}", f"# TYPE {full} {kind}",
                      f"{full} {floatToGoString(values[name])}")
    return "\n".join(lines) + "\n"


class _Ours:
    """prometheus-client collector for the mlxcel_ families."""

    def __init__(self, bridge: Bridge, watchdog: RequestWatchdog | None = None,
                 takeover=None) -> None:
        self.bridge = bridge
        self.watchdog = watchdog
        self.takeover = takeover   # sessions/takeover.Takeover, with a file:// store

    def collect(self):
        monitor = self.bridge.monitor
        # asleep: the values from the moment the engine fell asleep, so a scrape
        # while asleep equals the last one awake (upstream's sleep tests compare
        # the whole text); /props is_sleeping says the server sleeps
        c = monitor.before_sleep if monitor.sleeping and monitor.before_sleep else \
            monitor.counters
        requests = CounterMetricFamily("mlxcel_requests", "Generation jobs that ended, "
                                       "by outcome", labels=("outcome",))
        requests.add_metric(("finished",), c.finished)
        requests.add_metric(("failed",), c.failed)
        requests.add_metric(("cancelled",), c.cancelled)
        yield requests
        yield GaugeMetricFamily("mlxcel_slots", "Slots (--parallel)", value=len(monitor.slots))
        yield GaugeMetricFamily("mlxcel_slots_idle", "Slots holding no job", value=monitor.n_idle)
        yield CounterMetricFamily("mlxcel_sleeps", "Times the server went to sleep",
                                  value=c.sleeps)
        yield CounterMetricFamily("mlxcel_wakes", "Times a request woke the server",
                                  value=c.wakes)
        yield CounterMetricFamily("mlxcel_wake_load_seconds",
                                  "Time spent reloading the model on wake", value=c.wake_seconds)
        yield GaugeMetricFamily("mlxcel_sleep_released_bytes",
                                "Resident memory the last sleep gave back", value=c.released_bytes)
        yield CounterMetricFamily("mlxcel_embedding_inputs",
                                  "Embedding and rerank inputs computed", value=c.embedded)
        yield CounterMetricFamily("mlxcel_embedding_tokens",
                                  "Tokens of the embedding and rerank inputs computed",
                                  value=c.embedded_tokens)
        yield from _mlx_memory(c)
        # asleep: as the cache stood when the engine fell asleep, like the rest
        bridge = self.bridge
        cache = bridge.cache_stats_before_sleep if bridge.sleeping else bridge.cache_stats
        yield from _prompt_cache(cache)
        yield from _prompt_cache_tiers(cache)
        if self.watchdog is not None:
            yield CounterMetricFamily(
                "mlxcel_requests_stalled", "Requests seen without progress (no engine event, "
                "no byte written) for longer than the watchdog's bound",
                value=self.watchdog.stalled_total)
            yield GaugeMetricFamily("mlxcel_requests_stalled_now",
                                    "Requests without progress past the bound right now",
                                    value=self.watchdog.stalled_now)
        if self.takeover is not None:
            yield from _takeovers(self.takeover)


def _takeovers(t):
    """Streams a killed server left unfinished, continued or ended here."""
    done = CounterMetricFamily("mlxcel_stream_takeovers", "Unfinished streams of a killed "
                               "server taken over, by outcome (failed: ended with an error "
                               "frame)", labels=("outcome",))
    done.add_metric(("continued",), t.continued)
    done.add_metric(("failed",), t.failed)
    yield done
    yield SummaryMetricFamily("mlxcel_stream_takeover_first_token_seconds",
                              "From a takeover's claim to its first continued byte",
                              count_value=t.first_token_n, sum_value=t.first_token_sum)


def _mlx_memory(c):
    """MLX's allocator, as the engine thread last read it (at most once a
    second while it computes, and when it goes idle; zeros before it first
    did), and the engine's memory releases (engine/memory_release.py).
    Resident memory is about the first two plus the process's own heap."""
    m = c.memory or MlxMemory(0, 0, 0)
    yield GaugeMetricFamily("mlxcel_mlx_active_bytes", "Bytes of live MLX arrays (weights, "
                            "KV, the prompt cache's included)", value=m.active)
    yield GaugeMetricFamily("mlxcel_mlx_cache_bytes", "Bytes of freed buffers MLX keeps for "
                            "reuse (its buffer cache)", value=m.cache)
    yield GaugeMetricFamily("mlxcel_mlx_peak_bytes", "The most bytes of live MLX arrays "
                            "since start", value=m.peak)
    yield CounterMetricFamily("mlxcel_memory_releases", "Times the engine emptied MLX's "
                              "buffer cache and trimmed the C heap", value=m.releases)
    yield CounterMetricFamily("mlxcel_memory_release_seconds", "Time those releases took",
                              value=m.release_seconds)
    yield CounterMetricFamily("mlxcel_memory_released_bytes", "Resident bytes those releases "
                              "gave back", value=m.released_bytes)


def _prompt_cache(st: CacheStats | None):
    """The prompt cache's occupancy, as the engine last reported it (zeros
    before its first report)."""
    st = st or CacheStats(0, 0, 0, 0, 0, 0)
    yield GaugeMetricFamily("mlxcel_prompt_cache_bytes", "Bytes of KV the prompt cache holds",
                            value=st.bytes)
    yield GaugeMetricFamily("mlxcel_prompt_cache_budget_bytes",
                            "The prompt cache's byte budget (-1: no limit)", value=st.budget_bytes)
    yield GaugeMetricFamily("mlxcel_prompt_cache_entries", "Prompts the prompt cache holds",
                            value=st.entries)
    yield CounterMetricFamily("mlxcel_prompt_cache_evictions",
                              "Prompt cache entries dropped for the budget", value=st.evictions)


def _prompt_cache_tiers(st):
    """Prompt-cache lookups by the tier that answered (memory, disk, none)
    and the prompt tokens each tier supplied."""
    hits = CounterMetricFamily("mlxcel_prompt_cache_lookups", "Prompt-cache lookups at "
                               "admission, by the tier that supplied a prefix (none: a miss)",
                               labels=("tier",))
    reused = CounterMetricFamily("mlxcel_prompt_cache_reused_tokens", "Prompt tokens the "
                                 "prompt cache supplied, by tier", labels=("tier",))
    disk = st.disk_hits if st else 0
    hits.add_metric(("memory",), (st.hits - disk) if st else 0)
    hits.add_metric(("disk",), disk)
    hits.add_metric(("none",), st.misses if st else 0)
    reused.add_metric(("memory",), st.reused_memory if st else 0)
    reused.add_metric(("disk",), st.reused_disk if st else 0)
    yield hits
    yield reused
    yield CounterMetricFamily("mlxcel_prompt_cache_shifted_tokens", "Of the reused prompt "
                              "tokens, those in chunks moved to a new position (--cache-reuse)",
                              value=st.reused_shifted if st else 0)
    yield CounterMetricFamily("mlxcel_prompt_cache_disk_writes_dropped", "Prompt cache entries "
                              "the disk tier did not write because its writer was behind "
                              "(--cache-disk)", value=st.disk_write_dropped if st else 0)


class Metrics:
    def __init__(self, bridge: Bridge, watchdog: RequestWatchdog | None = None,
                 takeover=None) -> None:
        self.bridge = bridge
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Ours(bridge, watchdog, takeover))

    def scrape(self) -> Response:
        bridge = self.bridge
        if not bridge.config.endpoint_metrics:
            return not_supported("metrics endpoint", "--metrics")
        body = _upstream_block(upstream_values(bridge)) + generate_latest(self.registry).decode()
        resp = Response(body, status=200, content_type=CONTENT_TYPE)
        resp.headers["Process-Start-Time-Unix"] = str(int(bridge.monitor.counters.t_start))
        return resp
