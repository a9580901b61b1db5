"""The real-time driver: runs the scheduler on the wall clock and turns committed tokens into stream updates.

One asyncio task computes the next iteration, sleeps until its absolute deadline (so rounding never accumulates
into drift), commits its tokens and wakes the streams it touched. asyncio's timers wake up to ~1 ms late, so the
task sleeps until slightly before the deadline, then takes sub-millisecond naps between yields to other tasks until
it is reached. How late each iteration really ended (the lag) goes to /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from rig.sim.cost import ForwardCost
from rig.sim.power import PowerMeter, PowerModel
from rig.sim.prefix_cache import PrefixCache
from rig.sim.profile import Profile
from rig.sim.prometheus import SimMetrics
from rig.sim.requests import Sampling, build_req, output_stream, plan_request, prompt_key
from rig.sim.scheduler import EngineConfig, Iteration, Req, Scheduler
from rig.sim.text import OutputStream, stable_hash

log = logging.getLogger("rig.sim")
# If the host stalls the simulator (a busy machine, a swap), the schedule runs late. Up to RESYNC_S behind, it catches
# up by running the late iterations back to back, so throughput keeps to the model and only the stream timing shows
# the stall; further behind, it restarts from now and counts the skipped time in sglang:sim_behind_seconds_total.
RESYNC_S = 1.0
NAP_S = 0.0002  # the blocking nap between yields in an iteration's last stretch (_sleep_until)


@dataclass
class Stream:
    """What one HTTP request sees: the tokens committed so far and when; the handler renders chunks from it."""

    rid: str
    req: Req
    out: OutputStream
    sampling: Sampling
    prompt_tokens: int
    stops: tuple[str, ...]
    log_metrics: bool
    received_wall: float
    event: asyncio.Event = field(default_factory=asyncio.Event)
    text: str = ""
    ids_csv: str = ""  # output ids as "1,2,3": cumulative, appended to
    n_tokens: int = 0  # tokens generated (committed)
    matched: str | int | None = None
    finished: bool = False
    first_token_wall: float | None = None
    finished_wall: float | None = None
    sent_wall: float | None = None  # when the first answer (chunk or whole body) went out: its meta_info says so
    last_chunk_mono: float | None = None
    signalled: int = 0  # tokens already announced to the handler (stream_interval)
    abort_message: str = "client disconnected"

    @property
    def finish_reason(self) -> dict | None:
        if not self.finished:
            return None
        r = self.req.finish_reason
        if r == "length":
            return {"type": "length", "length": self.n_tokens}
        if r == "stop":
            return {"type": "stop", "matched": self.matched}
        return {"type": "abort", "message": self.abort_message}


class Engine:
    """Scheduler + prefix cache + token streams + metrics, on the wall clock."""

    def __init__(
        self,
        profile: Profile,
        cfg: EngineConfig,
        *,
        tp: int,
        seed: int,
        metrics: SimMetrics,
        radix: bool,
        decode_log_interval: int,
        stream_interval: int,
        spin_s: float,
    ):
        self.profile = profile
        self.cfg = cfg
        self.sched = Scheduler(cfg, ForwardCost(profile, tp))
        self.cache = PrefixCache(cfg.kv_pool_tokens) if radix else None
        self.metrics = metrics
        self.seed = seed
        self.decode_log_interval = decode_log_interval
        self.stream_interval = stream_interval
        self.spin_s = spin_s
        self.time_scale = 1.0  # test-only slow-down (--sim-fault slow=F)
        self._wake = asyncio.Event()
        self._n = 0
        self._task: asyncio.Task | None = None
        self.loop = asyncio.get_running_loop()
        self.wall_offset = time.time() - self.loop.time()
        self.tp = tp
        # Simulated draw of each of the tp GPUs (they run every forward on their shards alike): GET /sim/gpu
        self.power = PowerMeter(PowerModel(profile, self.sched.cost, cfg.steps), self.loop.time())
        # interval statistics for the decode log line and the scheduler gauges
        self._iv_start = self.loop.time()
        self._iv_tokens = 0
        self._iv_verify = 0
        self._iv_accepted = 0
        self._iv_decodes = 0
        self._iv_dec_tokens = 0
        self.last_gen_throughput = 0.0
        self.avg_spec_accept_length: float | None = None  # cumulative, folded every log interval
        self._cache_hits = 0
        self._cache_prompt = 0
        self.last_output = float("-inf")  # loop time of the last completed iteration

    # ---- lifecycle ----
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sim-engine")

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wall(self, mono: float) -> float:
        return mono + self.wall_offset

    # ---- requests ----
    def submit(
        self,
        toks: list[str],
        ids: list[int],
        s: Sampling,
        *,
        rid: str | None,
        stops: tuple[str, ...] = (),
        log_metrics: bool = True,
    ) -> Stream:
        """Queue a tokenized request; its Stream fills as iterations commit tokens."""
        self._n += 1
        rid = rid or f"{stable_hash('rid', self.seed, self._n):016x}"
        if s.seed is None and not s.greedy:
            s = Sampling(
                s.max_new_tokens,
                s.temperature,
                s.top_p,
                s.top_k,
                s.ignore_eos,
                stable_hash("seed", self.seed, self._n) % (2**31),
            )
        key = prompt_key(ids)
        plan = plan_request(self.profile, self.cfg.chain_steps, toks, key, s)
        cached = self.cache.match(ids) if self.cache is not None else 0
        req = build_req(rid, plan, len(ids), s, stable_hash("acc", self.seed, self._n), cached=cached)
        now = self.loop.time()
        st = Stream(rid, req, output_stream(self.profile, plan), s, len(ids), stops, log_metrics, self.wall(now))
        req.user = (st, ids)
        self.sched.submit(req, now)
        self._wake.set()
        return st

    def abort(self, st: Stream, message: str | None = None) -> None:
        if not st.finished:
            if message is not None:
                st.abort_message = message
            self.sched.abort(st.req)
            st.finished = True
            st.finished_wall = self.wall(self.loop.time())
            if st.log_metrics:
                self.metrics.num_aborted_requests_total.inc()
            st.event.set()

    def flush_cache(self) -> bool:
        """Clear the prefix cache and reset spec counters; refused (False) while requests run or wait."""
        if self.sched.busy:
            return False
        if self.cache is not None:
            self.cache.clear()
        self.sched.reset_counters()
        self.avg_spec_accept_length = None
        self._iv_tokens = self._iv_verify = self._iv_accepted = self._iv_decodes = self._iv_dec_tokens = 0
        self.metrics.reset_lag()
        return True

    # ---- the loop ----
    async def _run(self) -> None:
        loop = self.loop
        t: float | None = None
        while True:
            if not self.sched.busy:
                self._wake.clear()
                await self._wake.wait()
                t = None
            now = loop.time()
            if t is None:
                t = now
            elif now - t > RESYNC_S:
                self.metrics.sim_behind_seconds_total.inc(now - t)
                t = now
            it = self.sched.plan(t)
            if it is None:
                t = None
                await asyncio.sleep(0)
                continue
            deadline = t + it.duration * self.time_scale
            self.power.run(it, t, deadline)
            await self._sleep_until(deadline)
            self.metrics.observe_lag(max(0.0, loop.time() - deadline))
            touched = self.sched.complete(it, deadline, t)
            self.last_output = deadline  # any scheduler output counts for /health (http_server.py)
            self._dispatch(touched, deadline)
            self._account(it, deadline)
            t = deadline

    async def _sleep_until(self, deadline: float) -> None:
        loop = self.loop
        delay = deadline - loop.time() - self.spin_s
        if delay > 0:
            await asyncio.sleep(delay)
        # The last stretch (asyncio's timers wake up to 1 ms late): short blocking naps between yields keep the deadline
        # to a fraction of a millisecond while the handlers still run, and burn no CPU (a yield-spin took ~40 % of the
        # sim's CPU at 4x speed, C=64). Behind schedule it still yields once, so the streams get each caught-up
        # iteration's tokens and new requests are received when they come, not in one burst after the catch-up.
        while True:
            await asyncio.sleep(0)
            rest = deadline - loop.time()
            if rest <= 0:
                return
            time.sleep(min(rest, NAP_S))

    def _dispatch(self, touched: list[Req], t_end: float) -> None:
        """Render the tokens an iteration committed into each touched stream and wake its handler."""
        wall = self.wall(t_end)
        m = self.metrics
        for req in touched:
            st, _ = req.user
            n = req.last_new
            if n:
                ids, text = st.out.extend(n)
                if st.stops:
                    n, ids, text = self._apply_stops(st, req, ids, text, t_end)
                st.n_tokens += n
                st.ids_csv = (st.ids_csv + "," if st.ids_csv else "") + ",".join(map(str, ids))
                st.text += text
                if st.first_token_wall is None:
                    st.first_token_wall = wall
                    if st.log_metrics:
                        m.ttft.observe(wall - st.received_wall)
                elif st.log_metrics and st.last_chunk_mono is not None:
                    gap = (t_end - st.last_chunk_mono) / n
                    for _ in range(n):
                        m.itl.observe(gap)
                st.last_chunk_mono = t_end
            if req.done and not st.finished:
                self._finish(st, req, wall)
            if st.finished or st.n_tokens - st.signalled >= self.stream_interval:
                st.signalled = st.n_tokens
                st.event.set()

    def _apply_stops(self, st: Stream, req: Req, ids: list[int], text: str, t_end: float) -> tuple[int, list[int], str]:
        """Cut the output at the first stop string; the tokens after it are dropped."""
        full = st.text + text
        hit = min(
            ((full.find(s, max(0, len(st.text) - len(s))), s) for s in st.stops if s),
            default=(-1, ""),
            key=lambda x: (x[0] < 0, x[0]),
        )
        pos, s = hit
        if pos < 0:
            return len(ids), ids, text
        # Keep tokens until the one that completes the stop string; text ends before the stop string.
        pieces = st.out.pieces[len(st.out.pieces) - len(ids) :]
        acc = len(st.text)
        keep = len(ids)
        for i, p in enumerate(pieces):
            acc += len(p)
            if acc >= pos + len(s):
                keep = i + 1
                break
        st.matched = s
        self.sched.finish_early(req, st.n_tokens + keep, "stop", t_end)
        return keep, ids[:keep], full[len(st.text) : pos]

    def _finish(self, st: Stream, req: Req, wall: float) -> None:
        st.finished = True
        st.finished_wall = wall
        if req.finish_reason == "stop" and st.matched is None:
            st.matched = st.out.ids[-1] if st.out.ids else None
        if st.log_metrics:
            m = self.metrics
            m.num_requests_total.inc()
            m.prompt_tokens_total.inc(st.prompt_tokens)
            m.generation_tokens_total.inc(st.n_tokens)
            m.cached_tokens_total.inc(req.cached)
            m.e2e.observe(wall - st.received_wall)
            if req.verify_ct:
                m.spec_verify_calls_total.inc(req.verify_ct)
            if st.n_tokens > 1 and st.first_token_wall is not None:
                m.tpot.observe((wall - st.first_token_wall) / (st.n_tokens - 1))
            self._cache_hits += req.cached
            self._cache_prompt += st.prompt_tokens
        if self.cache is not None:
            _, ids = req.user
            self.cache.insert(ids + st.out.ids[: st.n_tokens])

    # ---- periodic statistics, like SGLang's decode log ----
    def _account(self, it: Iteration, t_end: float) -> None:
        c = self.sched.counters
        if it.kind == "prefill":
            self._update_gauges()
            log.debug(
                "Prefill batch, #new-seq: %d, #new-token: %d, #running-req: %d, #queue-req: %d",
                len(it.reqs),
                it.tokens,
                self.sched.num_running,
                len(self.sched.waiting),
            )
            return
        self._iv_decodes += 1
        if self._iv_decodes < self.decode_log_interval:
            return
        dt = max(1e-9, t_end - self._iv_start)
        tokens = c.generated_tokens - self._iv_tokens
        verify = c.verify_calls - self._iv_verify
        accepted = c.accepted_drafts - self._iv_accepted
        self.last_gen_throughput = tokens / dt
        m = self.metrics
        m.gen_throughput.set(self.last_gen_throughput)
        parts = [
            f"Decode batch, #running-req: {len(self.sched.running)}, #token: {self.sched.used_tokens()}, "
            f"token usage: {self.sched.used_tokens() / self.cfg.kv_pool_tokens:.2f}, "
        ]
        if self.cfg.steps > 0 and verify:
            al = (c.decode_tokens - self._iv_dec_tokens) / verify
            # metrics_reporter.py report_decode_stats divides by the startup draft count (server_args
            # speculative_num_draft_tokens - 1), not the active tier's: under adaptive the rate is off the same way
            rate = accepted / (verify * self.cfg.steps)
            m.spec_accept_length.set(al)
            m.spec_accept_rate.set(rate)
            parts.append(f"accept len: {al:.2f}, accept rate: {rate:.2f}, ")
            if c.verify_calls:
                self.avg_spec_accept_length = c.decode_tokens / c.verify_calls
            # the gauges read the worker's active tier at each decode log (_active_spec_config_snapshot)
            m.spec_num_steps.set(self.sched.active_steps)
            m.spec_num_draft_tokens.set(self.sched.active_steps + 1)
        parts.append(
            f"cuda graph: True, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.sched.waiting)}"
        )
        log.info("".join(parts))
        self._update_gauges()
        self._iv_start = t_end
        self._iv_tokens = c.generated_tokens
        self._iv_verify = c.verify_calls
        self._iv_accepted = c.accepted_drafts
        self._iv_dec_tokens = c.decode_tokens
        self._iv_decodes = 0

    def _update_gauges(self) -> None:
        m, s = self.metrics, self.sched
        used = s.used_tokens()
        m.num_running_reqs.set(s.num_running)
        m.num_queue_reqs.set(len(s.waiting))
        m.num_used_tokens.set(used)
        m.token_usage.set(used / self.cfg.kv_pool_tokens)
        if self._cache_prompt:
            m.cache_hit_rate.set(self._cache_hits / self._cache_prompt)
