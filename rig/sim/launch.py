"""Start the simulated server like sglang.launch_server: resolve flags, log the startup lines, serve, warm up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

from aiohttp import web

from rig.sim.adaptive import AdaptiveConfigError, AdaptiveSpec, build_runtime_states, cuda_graph_bs, load_config
from rig.sim.app import create_app
from rig.sim.args import SGLANG_VERSION, ServerArgs, context_length_allowed, main_error, resolve
from rig.sim.capacity import Capacity, CapacityError, StateFlags, compute_capacity
from rig.sim.engine import Engine
from rig.sim.generation import GenerationConfigError, chat_defaults
from rig.sim.profile import REFERENCE_PROFILE, Profile, ProfileError, load_profile
from rig.sim.prometheus import SimMetrics
from rig.sim.requests import Sampling
from rig.sim.scheduler import EngineConfig
from rig.sim.server import SimServer
from rig.sim.text import token_id, tokenize

log = logging.getLogger("rig.sim")
READY_LINE = "The server is fired up and ready to roll!"


def keepalive_timeout() -> float:
    """Seconds an idle keep-alive connection stays open: uvicorn's timeout_keep_alive, which SGLang sets from
    SGLANG_TIMEOUT_KEEP_ALIVE (environ.py: 5; entrypoints/http_server.py passes it to uvicorn)."""
    raw = os.environ.get("SGLANG_TIMEOUT_KEEP_ALIVE", "5")
    try:
        return float(int(raw))
    except ValueError:
        main_error(f"SGLANG_TIMEOUT_KEEP_ALIVE must be an integer, got {raw!r}")


def configure_logging(level: str, tp: int) -> None:
    """SGLang's format: [YYYY-mm-dd HH:MM:SS] message (a TP>1 scheduler adds ' TP0')."""
    prefix = " TP0" if tp > 1 else ""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"[%(asctime)s{prefix}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger("rig.sim")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    root.propagate = False


def main(argv: list[str] | None = None) -> None:
    args, profile, cap, context_len, profile_path = prepare(argv)
    configure_logging(args.log_level, args.tp_size)
    if args.sim_no_access_log:
        logging.getLogger("rig.sim.access").setLevel(logging.WARNING)
    for w in args.warnings:
        log.warning(w)
    for flag in args.ignored:
        log.info("%s is accepted (SGLang %s has it) but not modelled by the simulator: ignored", flag, SGLANG_VERSION)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args, profile, cap, context_len, profile_path))


def _startup_lines(args: ServerArgs, cap: Capacity, profile: Profile) -> None:
    mem = profile.gpu_mem_gb
    after_w = mem - cap.weight_gb_per_gpu
    log.info("Load weight begin. avail mem=%.2f GB", mem - 0.5)
    log.info(
        "Load weight end. elapsed=0.00 s, type=%s, dtype=torch.bfloat16, avail mem=%.2f GB, mem usage=%.2f GB.",
        "Qwen3_5MoeForConditionalGeneration",
        after_w,
        cap.weight_gb_per_gpu,
    )
    log.info(
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: %d, K size: %.2f GB, V size: %.2f GB",
        cap.max_total_num_tokens,
        cap.kv_pool_gb / 2,
        cap.kv_pool_gb / 2,
    )
    log.info(
        "Mamba Cache is allocated. max_mamba_cache_size: %d, state size: %.2f GB",
        cap.max_mamba_cache_size,
        cap.state_pool_gb,
    )
    log.info("Memory pool end. avail mem=%.2f GB", cap.available_gpu_mem_gb + profile.graph_reserve_gb)
    phases = ["target verify", "draft decode"] if args.speculative else ["target decode"]
    for ph in phases:
        log.info(
            "Capture %s CUDA graph begin. backend=simulated, avail mem=%.2f GB",
            ph,
            cap.available_gpu_mem_gb + profile.graph_reserve_gb,
        )
        log.info(
            "Capture %s CUDA graph end. bs=[1, 2, 4, 8, 16, 24, 32, 48], elapsed=0.00 s, mem usage=%.2f GB, "
            "avail mem=%.2f GB.",
            ph,
            profile.graph_reserve_gb / len(phases),
            cap.available_gpu_mem_gb,
        )
    log.info(
        "max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, max_running_requests=%d, "
        "context_len=%d, available_gpu_mem=%.2f GB",
        cap.max_total_num_tokens,
        args.chunked_prefill_size,
        args.max_prefill_tokens,
        cap.max_running_requests,
        args.context_length,
        cap.available_gpu_mem_gb,
    )
    requested = args.max_running_requests  # the flag, or the 48 speculation sets (args.py)
    if requested is not None and cap.max_running_requests < requested:
        # kv_cache_configurator.py resolve_max_num_reqs
        log.warning(
            "max_running_requests was reduced from the requested %d to %d (per dp worker) due to the available KV "
            "cache capacity.",
            requested,
            cap.max_running_requests,
        )


def graph_batch_sizes(args: ServerArgs, cap: Capacity) -> list[int]:
    """The decode CUDA-graph batch sizes, up to --cuda-graph-max-bs-decode and the running-request limit."""
    limit = cap.max_running_requests
    if args.cuda_graph_max_bs_decode is not None:
        limit = min(limit, args.cuda_graph_max_bs_decode)
    return cuda_graph_bs(limit)


def adaptive_spec(args: ServerArgs, cap: Capacity) -> AdaptiveSpec | None:
    """The adaptive controller's configuration (the file was checked at resolution: args.py _resolve_adaptive)."""
    if not (args.speculative and args.speculative_adaptive):
        return None
    try:
        slots = load_config(args.speculative_adaptive_config, args.sim_sglang_version)
    except AdaptiveConfigError as e:  # the file changed since the flags were resolved
        main_error(str(e))
    return AdaptiveSpec(slots, tuple(graph_batch_sizes(args, cap)))


def _adaptive_startup(args: ServerArgs, spec: AdaptiveSpec) -> None:
    """The controller's startup lines; on emulated 0.5.17 a tier wider than the startup one fails the launch."""
    log.info(spec.controller(args.steps).startup_line())
    lines, failure = build_runtime_states(spec, args.steps, args.sim_sglang_version)
    for line in lines:
        log.info(line)
    if failure is not None:
        log.error("Scheduler hit an exception: %s", failure)
        main_error(f"SGLang {args.sim_sglang_version} fails at startup: {failure}")


def build_server(args: ServerArgs, profile: Profile, cap: Capacity, context_len: int, profile_path: str) -> SimServer:
    """Metrics, engine (started) and handler state; must be called inside the event loop."""
    metrics = SimMetrics(
        args.served_model_name,
        args.bucket_time_to_first_token,
        args.bucket_inter_token_latency,
        args.bucket_e2e_request_latency,
    )
    cfg = EngineConfig(
        steps=args.steps,
        max_running=cap.max_running_requests,
        kv_pool_tokens=cap.max_total_num_tokens,
        chunked_prefill_size=args.chunked_prefill_size,
        max_prefill_tokens=args.max_prefill_tokens,
        new_token_ratio=profile.new_token_ratio,
        adaptive=adaptive_spec(args, cap),
    )
    engine = Engine(
        profile,
        cfg,
        tp=args.tp_size,
        seed=args.random_seed,
        metrics=metrics,
        radix=not args.disable_radix_cache,
        decode_log_interval=args.decode_log_interval,
        stream_interval=args.stream_interval,
        spin_s=max(0.0, args.sim_spin_ms) / 1000.0,
    )
    for g, v in (
        (metrics.max_total_num_tokens, cap.max_total_num_tokens),
        (metrics.context_len, context_len),
        (metrics.spec_num_steps, args.steps),
        (metrics.spec_num_draft_tokens, args.speculative_num_draft_tokens or 0),
    ):
        g.set(v)
    engine.start()
    srv = SimServer(args, profile, cap, engine, metrics, context_len, profile_path)
    srv.chat_defaults = chat_defaults(args.model_path, args.sampling_defaults, profile.notes)
    return srv


def state_flags(args: ServerArgs) -> StateFlags:
    """The resolved flags that size the recurrent-state pool (after --enable-deterministic-inference's changes)."""
    return StateFlags(
        disable_radix_cache=bool(args.disable_radix_cache),
        disable_overlap_schedule=bool(args.disable_overlap_schedule),
        mamba_radix_cache_strategy=args.mamba_radix_cache_strategy,
        max_mamba_cache_size=args.max_mamba_cache_size,
        mamba_full_memory_ratio=args.mamba_full_memory_ratio,
        page_size=int(args.page_size or 1),
    )


def prepare(argv: list[str] | None = None) -> tuple[ServerArgs, Profile, Capacity, int, str]:
    """Resolve flags, load the profile, size memory: (args, profile, capacity, context_len, profile_path)."""
    args = resolve(argv)
    try:
        profile = load_profile(args.sim_profile)
    except ProfileError as e:
        main_error(str(e))
    model_max = int(profile.context_length)
    context_len = args.context_length or model_max
    if not context_length_allowed(context_len, model_max):
        main_error(
            f"User-specified context_length ({context_len}) is greater than the derived context_length "
            f"({model_max}). Set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 to allow it."
        )
    try:
        cap = compute_capacity(
            profile,
            tp=args.tp_size,
            mem_fraction_static=args.mem_fraction_static,
            draft_tokens=args.speculative_num_draft_tokens or 0,
            speculative=args.speculative,
            max_running_requests=args.max_running_requests,
            max_total_tokens=args.max_total_tokens,
            context_length=context_len,
            flags=state_flags(args),
        )
    except CapacityError as e:
        main_error(str(e))
    try:
        chat_defaults(args.model_path, args.sampling_defaults, profile.notes)
    except GenerationConfigError as e:
        main_error(str(e))
    if args.mem_fraction_static is None:
        args.ns.mem_fraction_static = profile.default_mem_fraction_static
    if args.chunked_prefill_size is None:
        args.ns.chunked_prefill_size = int(profile.default_chunked_prefill_size)
    if args.context_length is None:
        args.ns.context_length = context_len
    return args, profile, cap, context_len, str(args.sim_profile or REFERENCE_PROFILE)


async def serve(args: ServerArgs, profile: Profile, cap: Capacity, context_len: int, profile_path: str) -> None:
    _startup_lines(args, cap, profile)
    spec = adaptive_spec(args, cap)
    if spec is not None:
        _adaptive_startup(args, spec)
    srv = build_server(args, profile, cap, context_len, profile_path)
    if srv.chat_defaults:  # serving_chat.py logs this once
        log.info("Using default chat sampling params from model generation config: %s", srv.chat_defaults)
    engine = srv.engine
    runner = web.AppRunner(
        create_app(srv), access_log=None, handle_signals=False, keepalive_timeout=keepalive_timeout()
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        log.error("Could not bind %s:%d: %s", args.host, args.port, e.strerror or e)
        await engine.stop()
        raise SystemExit(1) from None
    log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", args.host, args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if not args.skip_server_warmup:
        text = "The capital city of France is"
        toks = tokenize(text)
        st = engine.submit(
            toks, [token_id(t) for t in toks], Sampling(max_new_tokens=8, temperature=0.0), rid=None, log_metrics=False
        )
        await srv.wait_finished(st)
        logging.getLogger("rig.sim.access").info('127.0.0.1:0 - "POST /generate HTTP/1.1" 200')
        engine.flush_cache()  # the warmup leaves no trace in counters or cache
    srv.ready = True
    log.info(READY_LINE)
    await stop.wait()
    srv.shutting_down = True
    log.info("Shutting down.")
    await runner.cleanup()
    await engine.stop()
