"""Prometheus metrics with SGLang's names (SGLang's observability/metrics_collector.py), plus the sim's lag figures."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    exposition,
    generate_latest,
)

# SGLang's default buckets (tokenizer metrics).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    200.0,
    400.0,
    800.0,
)
LAG_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)
# What SGLang's /metrics (prometheus_client's ASGI app) answers a client that asks for no format (choose_encoder): the
# 0.0.4 text format, whose type names it (newer prometheus_client releases' CONTENT_TYPE_LATEST says version=1.0.0).
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)
# The simulator's count of modelled time it could not keep to, and of iterations that ended over SIM_LATE_S after their
# deadline (caught up, but the streams' timing then was off by as much); rig flags a point where either grew.
SIM_BEHIND_METRIC = "sglang:sim_behind_seconds_total"
SIM_LATE_METRIC = "sglang:sim_late_iterations_total"
SIM_LATE_S = 0.1

disable_created_metrics()  # SGLang serves multiprocess-mode metrics, which have no *_created samples


class SimMetrics:
    """One registry; scheduler gauges are set by the engine, tokenizer counters and histograms per request."""

    def __init__(
        self,
        model_name: str,
        ttft_buckets: Sequence[float] | None = None,
        itl_buckets: Sequence[float] | None = None,
        e2e_buckets: Sequence[float] | None = None,
    ) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        sched = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        tok = ["model_name", "engine_type"]
        self._sched_labels = {
            "model_name": model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        self._tok_labels = {"model_name": model_name, "engine_type": "unified"}

        def g(name: str, doc: str) -> Gauge:
            return Gauge(f"sglang:{name}", doc, sched, registry=r).labels(**self._sched_labels)

        def c(name: str, doc: str) -> Counter:
            return Counter(f"sglang:{name}", doc, tok, registry=r).labels(**self._tok_labels)

        def h(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(f"sglang:{name}", doc, tok, buckets=buckets, registry=r).labels(**self._tok_labels)

        self.num_running_reqs = g("num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = g("num_queue_reqs", "The number of requests in the waiting queue.")
        self.num_used_tokens = g("num_used_tokens", "The number of used tokens.")
        self.token_usage = g("token_usage", "The token usage (fraction of the KV pool).")
        self.gen_throughput = g("gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = g("cache_hit_rate", "The prefix cache hit rate.")
        self.spec_accept_length = g("spec_accept_length", "The average acceptance length of speculative decoding.")
        self.spec_accept_rate = g("spec_accept_rate", "The acceptance rate of draft tokens.")
        self.spec_num_steps = g("spec_num_steps", "speculative_num_steps.")
        self.spec_num_draft_tokens = g("spec_num_draft_tokens", "speculative_num_draft_tokens.")
        self.max_total_num_tokens = g("max_total_num_tokens", "Size of the KV pool in tokens.")
        self.context_len = g("context_len", "Context length.")
        self.sim_lag = g(
            "sim_lag_seconds", "Simulator: how late (s) the latest iteration ended after its simulated deadline."
        )
        self.sim_lag_max = g(
            "sim_lag_max_seconds", "Simulator: largest lag (s) since startup or the last /flush_cache."
        )
        # Not a gauge: the time lost adds up over a point, and rig's report reads it as a counter's change per point.
        self.sim_behind_seconds_total = Counter(
            SIM_BEHIND_METRIC.removesuffix("_total"),
            "Simulator: wall time (s) its schedule skipped because the host fell too far behind to catch up "
            "(the modelled hardware would have been working); over 0 in a point, its figures understate the model.",
            sched,
            registry=r,
        ).labels(**self._sched_labels)
        self.sim_late_iterations_total = Counter(
            SIM_LATE_METRIC.removesuffix("_total"),
            f"Simulator: iterations that ended over {SIM_LATE_S:g} s after their deadline (the host stalled it; caught "
            "up, but the streams' timing was off by as much); over 0 in a point, its timings are not the model's.",
            sched,
            registry=r,
        ).labels(**self._sched_labels)
        self.sim_iteration_lag = Histogram(
            "sglang:sim_iteration_lag_seconds",
            "Simulator: lag per iteration (s).",
            sched,
            buckets=LAG_BUCKETS,
            registry=r,
        ).labels(**self._sched_labels)

        self.prompt_tokens_total = c("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens_total = c("generation_tokens", "Number of generation tokens processed.")
        self.num_requests_total = c("num_requests", "Number of requests processed.")
        self.num_aborted_requests_total = c("num_aborted_requests", "Number of requests aborted.")
        self.cached_tokens_total = c("cached_tokens", "Number of cached prompt tokens.")
        self.spec_verify_calls_total = c("spec_verify_calls", "Number of speculative verify forwards (per request).")
        self.ttft = h(
            "time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_buckets or TTFT_BUCKETS
        )
        self.itl = h(
            "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_buckets or ITL_BUCKETS
        )
        self.e2e = h(
            "e2e_request_latency_seconds",
            "Histogram of end-to-end request latency in seconds",
            e2e_buckets or E2E_BUCKETS,
        )
        self.tpot = h(
            "request_time_per_output_token_seconds", "Histogram of time per output token in seconds.", ITL_BUCKETS
        )
        self.lag_max = 0.0

    def observe_lag(self, lag: float) -> None:
        self.sim_lag.set(lag)
        self.sim_iteration_lag.observe(lag)
        if lag > SIM_LATE_S:
            self.sim_late_iterations_total.inc()
        if lag > self.lag_max:
            self.lag_max = lag
            self.sim_lag_max.set(lag)

    def reset_lag(self) -> None:
        self.lag_max = 0.0
        self.sim_lag_max.set(0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
