"""The run's Ray placement and load-generator actors: start them, check they agree, stop and release them."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray

from rig.config import RunSpec
from rig.contracts import ClusterInfo, GeneratorEntry, GeneratorInfo, GeneratorProgress, HostCorpus, generator_entry
from rig.loadgen.actor import remote_class as generator_class
from rig.placement import (
    ClusterError,
    Placement,
    connect,
    host_clocks,
    measure_clock_offset,
    plan_placement,
    release,
    session_dir,
    set_outputs,
    verify_generators,
    wait_started,
)
from rig.run.errors import RunError, RunInputError
from rig.run.progress import Progress
from rig.server.engines import engine_for

# A level's common start, seconds ahead of the call that starts it (Fleet.start_lead_s): the start calls of a few
# generators on a busy driver fit in the lower bound; a slow network stretches it up to the upper one, which grows
# by LEAD_CEILING_PER_GENERATOR_S per generator (the start calls go out one after another: on 16 CPU cores, under
# the old rule, 10 x RTT + 5 ms a generator within a flat 2.0 s, 256 generators' last first send came 0.25 s late).
START_LEAD_S = (0.5, 2.0)
LEAD_CEILING_PER_GENERATOR_S = 0.01
# Hosts whose generators' clocks are probed at once (each probe is a few Ray round trips from the driver; more
# threads would inflate the round trips the offsets are judged by).
CLOCK_THREADS = 8
# The lead covers this many times the measured broadcast (every generator getting one call from the driver).
BROADCAST_MARGIN = 2.0


def corpus_mismatch(seen: dict[str, dict[str, Any]]) -> str | None:
    """One line naming the first host whose code corpus differs from the driver's (same files, same bytes), or None.
    Where a tree lives may differ between hosts; what it holds may not."""
    here = seen["driver"]
    for who, fp in seen.items():
        for wl, mine in here.items():
            theirs = fp.get(wl) or {}
            if fp.get("error") or theirs.get("sha256") != mine["sha256"]:
                got = fp.get("error") or (
                    f"{theirs.get('root')} ({theirs.get('files')} files, sha256 {theirs.get('sha256')})"
                )
                return (
                    f"{who} would build different {wl} prompts for one seed: its code corpus is {got}, the "
                    f"driver's {mine['root']} ({mine['files']} files, sha256 {mine['sha256']}); pin one tree "
                    f"present on every host with --workload-opt code_dir=PATH"
                )
    return None


class Fleet:
    """The placement and the generator actors of one run (filled in as setup goes, so teardown frees what exists)."""

    def __init__(self) -> None:
        self.generators: list[Any] = []
        self.active: list[tuple[int, Any]] = []  # (generator id, handle) of generators still alive
        self.gen_info: list[GeneratorEntry] = []
        self.placement: Placement | None = None
        self.started_ray = False
        self.session_dir: Path | None = None  # the local Ray this run started keeps its logs here (~230 KB a run)
        # the longest a call took to reach every generator: timed at setup, then from each level's start notices
        self.broadcast_s = 0.0

    def setup(
        self,
        spec: RunSpec,
        run_dir: Path,
        progress: Progress,
        on_connect: Callable[[], None],
        stop: Callable[[], bool] | None = None,
    ) -> ClusterInfo:
        """Connect Ray, place and start the generators, check them; return the manifest's cluster section."""
        n = spec.clients
        self.started_ray = not ray.is_initialized()
        progress.status(
            "starting Ray" if spec.cluster.address is None else f"connecting to Ray at {spec.cluster.address}"
        )
        try:
            layout = connect(spec.cluster, n)
            if self.started_ray and spec.cluster.address is None:
                self.session_dir = session_dir()
            on_connect()  # after ray.init, which installs its own SIGTERM handler in the driver
            if stop is not None and stop():  # Ctrl-C while Ray started: place nothing
                raise KeyboardInterrupt
            gpus = max(engine_for(c.engine).num_gpus(c) for c in spec.server_configs())
            self.placement = plan_placement(spec.cluster, layout.nodes, gpus, n)
            Gen = generator_class()
            out_root = str(run_dir.resolve())
            self.generators = [
                Gen.options(**opts).remote(i, out_root) for i, opts in enumerate(self.placement.generator_options)
            ]
            self.active = list(enumerate(self.generators))
            started = wait_started(self.generators, spec.cluster.placement_timeout_s, stop=stop)
            infos = [GeneratorInfo.model_validate(i) for i in started]
            verify_generators(self.placement, infos)
            self.gen_info = [generator_entry(i) for i in infos]
            set_outputs(spec.cluster, run_dir, spec.run_id, self.generators, self.gen_info)
            if stop is not None and stop():
                raise KeyboardInterrupt
        except ClusterError as e:
            raise RunError(str(e)) from None
        corpus = self._check_corpus(spec)
        self._measure_clocks()
        # One call to every generator at once, timed: what a level's start calls take before the first level.
        t0 = time.monotonic()
        pairs = zip(self.generators, self.gen_info, strict=True)
        ray.get([g.set_clock_offset.remote(i["clock_offset_s"]) for g, i in pairs])
        self.broadcast_s = time.monotonic() - t0
        return ClusterInfo.model_validate(
            {
                **layout.model_dump(),
                "local": self.placement.local,
                "generators": self.gen_info,
                "hosts": host_clocks(self.gen_info),
                "server_node": self.placement.server_node,
                "results_uri": spec.cluster.results_uri,
                "corpus": corpus,
            }
        )

    def _measure_clocks(self) -> None:
        """Each generator's clock offset and RTT to the driver (offset = generator clock - driver clock; every
        record carries it, driver time = ts - offset). One host's generators one after another, hosts in parallel:
        16 round trips per generator, serially, were 3.5 s at 256 generators and would be ~14 s at 1,000."""
        by_host: dict[Any, list[tuple[Any, GeneratorEntry]]] = {}
        for g, info in zip(self.generators, self.gen_info, strict=True):
            by_host.setdefault(info.get("node_id") or info.get("host"), []).append((g, info))

        def host(pairs: list[tuple[Any, GeneratorEntry]]) -> None:
            for g, info in pairs:
                info["clock_offset_s"], info["clock_rtt_s"] = measure_clock_offset(g)

        if not by_host:
            return
        with ThreadPoolExecutor(max_workers=min(CLOCK_THREADS, len(by_host))) as pool:
            list(pool.map(host, by_host.values()))  # list(): a probe's exception is raised here

    def _check_corpus(self, spec: RunSpec) -> dict[str, Any] | None:
        """Record the prompt corpus each host would quote; refuse to start when they differ (the driver builds
        fixed-count levels, generators build duration-bound ones: one seed must mean the same requests)."""
        from rig.workloads import WorkloadError, corpus_fingerprints

        try:
            here = corpus_fingerprints(spec.workloads)
        except WorkloadError as e:
            raise RunInputError(str(e)) from None
        if not here:
            return None
        seen: dict[str, dict[str, Any]] = {"driver": here}
        for info, fp in zip(
            self.gen_info, ray.get([g.corpus.remote(spec.workloads) for g in self.generators]), strict=False
        ):
            there = HostCorpus.model_validate(fp)
            seen[f"generator {info['generator']} ({info['host']})"] = (
                {"error": there.error} if there.error is not None else there.model_dump()["fingerprints"]
            )
        why = corpus_mismatch(seen)
        if why:
            raise RunInputError(why)
        return seen

    def info(self, gid: int) -> GeneratorEntry | None:
        return next((i for i in self.gen_info if i["generator"] == gid), None)

    def start_lead_s(self) -> float:
        """How far ahead a level's common start is set: time for every active generator to get its start call,
        the larger of ten of the slowest one's ping round trips plus a few ms per generator and twice the measured
        broadcast, within START_LEAD_S (its ceiling grows with the generators)."""
        rtts = [(info.get("clock_rtt_s") if (info := self.info(g)) else None) or 0.0 for g, _ in self.active]
        lo, hi = START_LEAD_S
        need = max(10 * max(rtts, default=0.0) + 0.005 * len(rtts), BROADCAST_MARGIN * self.broadcast_s)
        return min(hi + LEAD_CEILING_PER_GENERATOR_S * len(rtts), max(lo, need))

    def observe_start(self, lead_s: float, notices: list[float | None]) -> float | None:
        """Learn from a level's start: each generator's notice (seconds its start call came before the common
        start, set ``lead_s`` ahead) says how long the calls took to reach all of them; the next levels' lead
        covers the slowest seen. Returns the shortest notice (< 0: a generator started late), None if none."""
        seen = [n for n in notices if n is not None]
        if not seen:
            return None
        self.broadcast_s = max(self.broadcast_s, lead_s - min(seen))
        return min(seen)

    def handle(self, gid: int) -> Any:
        return next((h for g, h in self.active if g == gid), None)

    def drop(self, gid: int) -> None:
        """Stop using a generator (it died or was killed)."""
        self.active = [(g, h) for g, h in self.active if g != gid]

    def stop_all(self) -> None:
        """Ask every live generator to stop its point (in-flight requests are recorded as cancelled)."""
        for _, g in self.active:
            with contextlib.suppress(Exception):
                g.stop.remote()

    def poll_progress(self) -> GeneratorProgress:
        """The live generators' progress merged: counters summed, latency sketches merged (a busy generator is
        skipped this beat)."""
        total = GeneratorProgress()
        refs = [g.progress.remote() for _, g in self.active]
        # One wait of at most a second for all of them: a get per generator, each with its own timeout, could hold
        # the driver a second per busy generator (hundreds of seconds at hundreds of swamped generators).
        with contextlib.suppress(Exception):
            refs, _ = ray.wait(refs, num_returns=len(refs), timeout=1)
        for ref in refs:
            with contextlib.suppress(Exception):  # a busy or dead generator: skip a beat
                total.merge(ray.get(ref, timeout=0))
        return total

    def close(self) -> None:
        """Close and kill the generators, release the placement, and shut Ray down if this run started it."""
        for g in self.generators:
            with contextlib.suppress(Exception):
                ray.get(g.close.remote(), timeout=5)
            with contextlib.suppress(Exception):
                ray.kill(g)
        self.generators = []
        with contextlib.suppress(Exception):
            release(self.placement)
        if self.started_ray and ray.is_initialized():
            ray.shutdown()

    def remove_session(self) -> None:
        """Remove the session directory of the local Ray this run started and has shut down (its logs: kept when
        the run did not complete, for the tracebacks Ray's worker logs hold)."""
        d = self.session_dir
        if d is None or ray.is_initialized() or not d.name.startswith("session_"):
            return
        latest = d.parent / "session_latest"
        with contextlib.suppress(OSError):
            if latest.is_symlink() and latest.resolve() == d.resolve():
                latest.unlink()
        shutil.rmtree(d, ignore_errors=True)
        self.session_dir = None
