"""Ray connection, node discovery, pre-flight checks and placement of the server and load generators.

Placement rules:
- the server asks for its GPUs (that is what sets CUDA_VISIBLE_DEVICES) plus the server label and/or resource;
- generators get a hard per-host guarantee: either a count resource (each client host advertises ``client: 1`` and
  each generator takes ``1 / per_host`` of it) or a STRICT_SPREAD placement group over the client label;
- unless allowed, generators are kept off the server node(s) by a ``ray.io/node-id`` label selector.
Every way the cluster can fall short is a ``ClusterError`` with a one-line message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from rig.config import ClusterSpec
from rig.contracts import GeneratorInfo
from rig.loadgen import spool
from rig.results import PART_GLOB, atomic_write

NODE_ID_LABEL = "ray.io/node-id"


class ClusterError(RuntimeError):
    """The cluster cannot be reached or cannot host the run; the message is one line."""


class PlacementError(ClusterError):
    """The cluster cannot host the run as asked; one line saying what is missing."""


@dataclass
class Placement:
    """How to create the server actor and each generator actor."""

    server_options: dict[str, Any]
    generator_options: list[dict[str, Any]]
    server_node: str | None
    client_nodes: list[str]
    local: bool
    placement_group: Any = None
    server_nodes: list[str] = field(default_factory=list)
    per_host: int = 1
    allow_on_server: bool = True


# ---------------------------------------------------------------------------------------------------- connection
class _RayInitOptions(TypedDict):
    """ray.init's keywords shared by a local start and a join."""

    include_dashboard: bool
    logging_level: int
    log_to_driver: bool
    configure_logging: bool


def connect(spec: ClusterSpec, n_generators: int) -> dict[str, Any]:
    """Start local Ray (embedded default) or join the cluster at spec.address. Returns a description.

    Joining an existing cluster never changes it: ``ray.shutdown()`` afterwards only disconnects this driver.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return describe_nodes()
    common = _RayInitOptions(
        include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False, configure_logging=True
    )
    if spec.address is None:
        # Logical CPUs are just numbers: enough for the server actor and every generator on one machine.
        cpus = spec.num_cpus or max(os.cpu_count() or 1, 1 + n_generators)
        # GPUs are detected (none on a CPU-only machine): a single-GPU-box run still gets CUDA_VISIBLE_DEVICES.
        with _loopback_only():
            ray.init(address="local", num_cpus=cpus, object_store_memory=spec.object_store_memory_mb * 2**20, **common)
    else:
        address = _check_reachable(spec.address)  # 'auto' resolved: join exactly the address that was checked
        try:
            ray.init(address=address, **common)
        except Exception as e:  # ConnectionError, auth mismatch, version mismatch, ...
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ClusterError(f"cannot join the Ray cluster at {spec.address}: {first[:300]}") from None
    return describe_nodes()


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """One machine: Ray's single-host mode (its default on macOS), where every node address is 127.0.0.1, so the
    processes Ray starts and the engine advertise loopback and nothing of the run is offered to the LAN. The
    environment variable reaches the raylet and its workers; the constant is what this driver already imported."""
    from ray._private import ray_constants

    name = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    old_env, old_const = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_const
        if old_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old_env


# The HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113 section 3.4): what a gRPC client sends
# first. A gRPC server (Ray's GCS, and the Ray client server behind ray://) answers with its own SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_H2_SETTINGS = 4  # frame type at byte 3 of a frame header


def _check_reachable(address: str, timeout_s: float = 5.0) -> str:
    """Fail fast, with rig's own one line, on HOST:PORT nobody listens on or where something that is not a gRPC
    server listens (ray.init would retry for minutes, or for ever against a silent port); return the address to
    join ('auto' resolved, so the cluster joined is the one checked)."""
    import socket

    shown = address
    if address == "auto":
        address = _auto_address()
        shown = f"{address} (what 'auto' found: maybe a stale record of a stopped cluster)"
    if address.startswith("local"):
        return address
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"cluster.address {address!r}: expected HOST:PORT, 'auto' or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as conn:
            conn.sendall(_H2_PREFACE)
            head = _read_some(conn, 9, timeout_s)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ClusterError(f"cannot reach the Ray cluster at {shown}: {why}") from None
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        seen = f"it answered {head[:24]!r}" if head else f"no answer within {timeout_s:g}s"
        raise ClusterError(
            f"cannot join the Ray cluster at {shown}: something listens there but it is not Ray "
            f"({seen}); check the address and port (a Ray head's GCS port, 6379 by default, or "
            f"ray://HOST:10001)"
        )
    return address


def _read_some(conn: Any, n: int, timeout_s: float) -> bytes:
    """Up to ``n`` bytes from ``conn`` within ``timeout_s`` (fewer when the peer stops or closes)."""

    out = b""
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            chunk = conn.recv(n - len(out))
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        out += chunk
    return out


def _auto_address() -> str:
    """What ``address: auto`` resolves to (RAY_ADDRESS, else the cluster this machine last started), so a stale
    record is checked like any HOST:PORT instead of leaving ray.init retrying for minutes."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env != "auto":
        return env
    tmp = Path(os.environ.get("RAY_TMPDIR") or "/tmp") / "ray" / "ray_current_cluster"
    try:
        found = tmp.read_text().strip().splitlines()[0].strip()
    except (OSError, IndexError):
        raise ClusterError(
            "cluster.address 'auto': no Ray cluster was started on this machine (no "
            f"{tmp}); start one with `ray start --head`, or give HOST:PORT"
        ) from None
    if not found:
        raise ClusterError(f"cluster.address 'auto': {tmp} is empty; give HOST:PORT")
    return found


def session_dir() -> Path | None:
    """The session directory of the Ray this driver is connected to (None when Ray does not say)."""
    try:
        from ray._private import worker  # no public API names it

        node = worker._global_node
        return Path(node.get_session_dir_path()) if node is not None else None
    except Exception:
        return None


def describe_nodes() -> dict[str, Any]:
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        nodes.append(
            {
                "node_id": n["NodeID"],
                "ip": n.get("NodeManagerAddress"),
                "hostname": n.get("NodeManagerHostname"),
                "labels": {k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith("ray.io/")},
                "cpus": res.get("CPU", 0),
                "gpus": res.get("GPU", 0),
                "resources": {k: v for k, v in res.items() if not k.startswith(("node:", "memory", "object_store"))},
            }
        )
    try:
        driver_node = ray.get_runtime_context().get_node_id()
    except Exception:
        driver_node = None
    return {
        "ray_version": ray.__version__,
        "nodes": nodes,
        "driver_node": driver_node,
        "driver_ip": ray.util.get_node_ip_address(),
    }


# ---------------------------------------------------------------------------------------------------- pre-flight
def _matches(node: dict[str, Any], label: dict[str, str], resource: str | None) -> bool:
    if label and any(node["labels"].get(k) != v for k, v in label.items()):
        return False
    if resource and node["resources"].get(resource, 0) <= 0:
        return False
    return True


def _describe_selector(label: dict[str, str], resource: str | None) -> str:
    parts = [f"label {k}={v}" for k, v in label.items()] + ([f"resource {resource!r}"] if resource else [])
    return " and ".join(parts) or "any node"


def _exclude(node_ids: Iterable[str]) -> dict[str, str]:
    ids = sorted(set(node_ids))
    return {NODE_ID_LABEL: f"!in({','.join(ids)})"} if ids else {}


def plan_placement(
    spec: ClusterSpec, nodes: list[dict[str, Any]], n_gpus: int, n_generators: int, timeout_s: float | None = None
) -> Placement:
    """Pre-flight: check the nodes can host the server and the generators, and say how to place them."""
    if n_generators < 1:
        raise PlacementError("at least one load generator is needed (--clients >= 1)")
    local = spec.address is None
    if local:
        have = nodes[0]["gpus"] if nodes else 0
        if n_gpus and have and have < n_gpus:
            raise PlacementError(f"the server needs {n_gpus} GPUs; this machine has {have:g}")
        return Placement(
            # Ask Ray for the GPUs when the machine has them (that sets CUDA_VISIBLE_DEVICES); the sim needs none.
            server_options={"num_cpus": 0, "num_gpus": n_gpus if have else 0},
            generator_options=[{"num_cpus": 1} for _ in range(n_generators)],
            server_node=nodes[0]["node_id"] if nodes else None,
            client_nodes=[nodes[0]["node_id"]] * n_generators if nodes else [],
            local=True,
            server_nodes=[nodes[0]["node_id"]] if nodes else [],
            per_host=max(n_generators, spec.per_host),
        )
    timeout_s = timeout_s if timeout_s is not None else spec.placement_timeout_s

    # --- the server
    servers = [n for n in nodes if _matches(n, spec.server_label, spec.server_resource)]
    if n_gpus and not (spec.server_label or spec.server_resource):
        servers = [n for n in servers if n["gpus"] > 0]
    if not servers:
        raise PlacementError(
            f"no alive node has {_describe_selector(spec.server_label, spec.server_resource)} "
            f"for the server ({len(nodes)} nodes in the cluster)"
        )
    if n_gpus and not any(n["gpus"] >= n_gpus for n in servers):
        best = max(n["gpus"] for n in servers)
        raise PlacementError(f"the server needs {n_gpus} GPUs on one node; the server node(s) have at most {best:g}")
    if n_gpus:
        servers = [n for n in servers if n["gpus"] >= n_gpus]
    server_cpus = 1 if any(n["cpus"] >= 1 for n in servers) else 0
    server_opts: dict[str, Any] = {"num_cpus": server_cpus, "num_gpus": n_gpus}
    if spec.server_label:
        server_opts["label_selector"] = dict(spec.server_label)
    if spec.server_resource:
        server_opts["resources"] = {spec.server_resource: 1}
    server_ids = [s["node_id"] for s in servers]
    server_node = server_ids[0] if len(server_ids) == 1 else None

    # --- the generators
    clients = [n for n in nodes if _matches(n, spec.client_label, spec.client_resource)]
    avoid = [] if spec.allow_generators_on_server_node else server_ids
    clients = [n for n in clients if n["node_id"] not in set(avoid)]
    if not spec.client_label and not spec.client_resource:
        clients = [n for n in clients if n["cpus"] >= 1]  # e.g. a head started with --num-cpus=0 hosts nothing
    where = _describe_selector(spec.client_label, spec.client_resource)
    off_server = "" if spec.allow_generators_on_server_node else ", not the server node"
    per_host = spec.per_host
    if spec.client_resource:
        # Each generator takes 1/per_host of the host's count resource: a host advertising 1 runs per_host
        # generators, one advertising k runs k * per_host. A hard guarantee: extra generators queue, never double up.
        share = 1.0 / per_host
        slots = {n["node_id"]: int(n["resources"].get(spec.client_resource, 0) * per_host + 1e-9) for n in clients}
        capacity = sum(slots.values())
    else:
        slots = {n["node_id"]: per_host if n["cpus"] >= per_host else 0 for n in clients}
        capacity = sum(slots.values())
    if capacity < n_generators:
        hosts = sum(1 for v in slots.values() if v > 0)
        raise PlacementError(
            f"{n_generators} generator(s) asked for, but only {hosts} client host(s) with {where}{off_server} "
            f"x per_host {per_host} = {capacity} slot(s); add client hosts or lower --clients"
        )

    selector = {**dict(spec.client_label), **_exclude(avoid)}
    pg = None
    if spec.client_resource:
        opts: dict[str, Any] = {"num_cpus": 0, "resources": {spec.client_resource: share}}
        if selector:
            opts["label_selector"] = selector
        gen_opts = [dict(opts) for _ in range(n_generators)]
    else:
        hosts = -(-n_generators // per_host)
        kwargs: dict[str, Any] = {"strategy": "STRICT_SPREAD"}
        if selector:
            kwargs["bundle_label_selector"] = [dict(selector) for _ in range(hosts)]
        pg = placement_group([{"CPU": per_host}] * hosts, **kwargs)
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except Exception:
            remove_placement_group(pg)
            raise PlacementError(
                f"could not spread {hosts} generator bundle(s) of {per_host} CPU over distinct "
                f"client hosts with {where}{off_server} within {timeout_s:g}s (STRICT_SPREAD); "
                f"are their CPUs in use?"
            ) from None
        gen_opts = [
            {"num_cpus": 1, "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, i // per_host)}
            for i in range(n_generators)
        ]
    return Placement(
        server_opts,
        gen_opts,
        server_node,
        [c["node_id"] for c in clients],
        local=False,
        placement_group=pg,
        server_nodes=server_ids,
        per_host=per_host,
        allow_on_server=spec.allow_generators_on_server_node,
    )


def verify_generators(placement: Placement, gen_info: list[dict[str, Any]]) -> None:
    """After the generators started: each is on an allowed client host, at most per_host per host."""
    if placement.local:
        return
    per_node: dict[str | None, int] = {}  # a generator outside Ray reports no node id
    for info in gen_info:
        node = info.get("node_id")
        per_node[node] = per_node.get(node, 0) + 1
        if not placement.allow_on_server and node in placement.server_nodes:
            raise PlacementError(f"generator {info['generator']} landed on the server node {info.get('node_ip')}")
        if placement.client_nodes and node not in placement.client_nodes:
            raise PlacementError(f"generator {info['generator']} landed on {info.get('node_ip')}, not a client host")
    crowded = {n: k for n, k in per_node.items() if k > placement.per_host}
    if crowded:
        node, k = next(iter(crowded.items()))
        ip = next(i.get("node_ip") for i in gen_info if i.get("node_id") == node)
        raise PlacementError(f"{k} generators landed on one client host ({ip}); per_host is {placement.per_host}")


def wait_started(
    handles: list[Any], timeout_s: float, what: str = "generator", stop: Callable[[], bool] | None = None
) -> list[Any]:
    """ray.get of each actor's info(), with a one-line error naming the actors that never got placed; ``stop``
    (a Ctrl-C) ends the wait with KeyboardInterrupt within half a second."""
    refs = [h.info.remote() for h in handles]
    deadline = time.monotonic() + timeout_s
    while True:
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        if not pending or time.monotonic() >= deadline:
            break
        if stop is not None and stop():
            raise KeyboardInterrupt
    if pending:
        idx = [refs.index(r) for r in pending]
        raise PlacementError(
            f"{len(pending)} {what}(s) ({', '.join(map(str, idx[:8]))}) could not be placed within "
            f"{timeout_s:g}s: the cluster has no free slot for them (resources in use?)"
        )
    return ray.get(refs)


# ---------------------------------------------------------------------------------------------------- clocks
def best_offset(samples: Iterable[tuple[float, float, float]]) -> tuple[float, float]:
    """(offset, rtt) from (t_send, t_remote, t_recv) samples: the lowest-RTT one wins.

    offset = remote clock - driver clock, so a remote timestamp ts is ``ts - offset`` on the driver's clock.
    """
    best: tuple[float, float] | None = None
    for t0, t_remote, t1 in samples:
        rtt = t1 - t0
        if best is None or rtt < best[1]:
            best = (t_remote - (t0 + t1) / 2, rtt)
    if best is None:
        raise ValueError("no clock samples")
    return best


def measure_clock_offset(actor: Any, pings: int = 15) -> tuple[float, float]:
    """(offset, rtt) of an actor's clock against the driver's, from the lowest-RTT of several pings."""
    ray.get(actor.clock.remote())  # warm the path (first call pays connection setup)
    samples = []
    for _ in range(pings):
        t0 = time.time()
        t_actor = ray.get(actor.clock.remote())
        samples.append((t0, t_actor, time.time()))
    return best_offset(samples)


def host_clocks(gen_info: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per client host (node IP): its clock offset and RTT (from its lowest-RTT generator) and its generators."""
    hosts: dict[str, dict[str, Any]] = {}
    for g in gen_info:
        key = g.get("node_ip") or g.get("host") or "?"
        h = hosts.setdefault(key, {"host": g.get("host"), "node_id": g.get("node_id"), "generators": []})
        h["generators"].append(g["generator"])
        if g.get("clock_rtt_s") is not None and (h.get("clock_rtt_s") is None or g["clock_rtt_s"] < h["clock_rtt_s"]):
            h["clock_offset_s"], h["clock_rtt_s"] = g["clock_offset_s"], g["clock_rtt_s"]
            h["clock_uncertainty_s"] = g["clock_rtt_s"] / 2
    return hosts


# ---------------------------------------------------------------------------------------------------- node files
def _on_node(node_id: str) -> dict[str, Any]:
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False), "max_retries": 0}


@ray.remote
def _list_files(root: str, rel_dir: str, pattern: str) -> list[str]:
    base = Path(root)
    d = base / rel_dir
    return sorted(str(p.relative_to(base)) for p in d.rglob(pattern)) if d.exists() else []


@ray.remote
def _read_files(root: str, rels: list[str]) -> dict[str, bytes]:
    return {r: (Path(root) / r).read_bytes() for r in rels}


@ray.remote
def _remove_files(root: str, rels: list[str]) -> int:
    n = 0
    for r in rels:
        try:
            (Path(root) / r).unlink()
            n += 1
        except FileNotFoundError:
            pass
    return n


def list_node_files(
    node_id: str, root: str, rel_dir: str, pattern: str = PART_GLOB, timeout_s: float = 30
) -> list[str]:
    """Files under root/rel_dir on a node (works after the actor that wrote them died, while the node lives)."""
    return ray.get(_list_files.options(**_on_node(node_id)).remote(root, rel_dir, pattern), timeout=timeout_s)


def read_node_files(node_id: str, root: str, rels: list[str], timeout_s: float = 120) -> Iterable[tuple[str, bytes]]:
    """Yield (rel, bytes) of files on a node, a few at a time (part files are small: a few MB at most)."""
    batch = 16
    for i in range(0, len(rels), batch):
        got = ray.get(_read_files.options(**_on_node(node_id)).remote(root, rels[i : i + batch]), timeout=timeout_s)
        yield from got.items()


def remove_node_files(node_id: str, root: str, rels: list[str], timeout_s: float = 30) -> int:
    if not rels:
        return 0
    return ray.get(_remove_files.options(**_on_node(node_id)).remote(root, rels), timeout=timeout_s)


def release(placement: Placement | None) -> None:
    if placement is not None and placement.placement_group is not None:
        remove_placement_group(placement.placement_group)


# ---------------------------------------------------------------------------------------------------- results
def set_outputs(
    spec: ClusterSpec, run_dir: Path, run_id: str, generators: list[Any], gen_info: list[dict[str, Any]]
) -> None:
    """Decide where each generator writes its part files, tell it, and record it in ``gen_info``.

    - ``results_uri`` a path (NFS) -> every generator writes there directly (``shared``);
    - ``results_uri`` an object store -> each writes its local spool and ships every closed part there (``ship``);
    - else the driver's results dir when the generator sees it (``direct``; ``shared_results: true`` insists on
      it), or a local spool on the generator's host (``spool``; ``shared_results: false`` forces it).
    Spooled parts reach the driver through Ray at the end of each point (``gather_parts``).
    """
    import secrets

    out_root = str(Path(run_dir).resolve())
    probe = Path(out_root) / f".visible-{secrets.token_hex(6)}"
    token = secrets.token_hex(16)
    probe.write_text(token)
    try:
        sees = ray.get([g.sees.remote(str(probe), token) for g in generators], timeout=60)
    finally:
        probe.unlink(missing_ok=True)
    plans = [output_for(spec, run_id, out_root, seen, info) for info, seen in zip(gen_info, sees)]
    problems = ray.get([g.set_output.remote(root, uri) for g, (root, uri, _) in zip(generators, plans)], timeout=120)
    for info, (root, uri, mode), problem in zip(gen_info, plans, problems):
        if problem:
            raise ClusterError(
                f"generator {info['generator']} on {info.get('host')} ({info.get('node_ip')}) "
                f"cannot write its results: {problem}"
            )
        info["output_mode"], info["ship_uri"] = mode, uri
    infos = ray.get([g.info.remote() for g in generators])
    for info, now in zip(gen_info, infos):
        info["spool_root"] = GeneratorInfo.model_validate(now).spool_root  # filled in for its host


def output_for(
    spec: ClusterSpec, run_id: str, out_root: str, seen: bool, info: dict[str, Any]
) -> tuple[str, str | None, str]:
    """(root template, ship URI, mode) for one generator; see ``set_outputs``."""
    spool_root = f"{spec.spool_dir.rstrip('/')}/{run_id}"
    if spec.results_uri and not spool.is_remote_uri(spec.results_uri):
        return f"{spool.local_path(spec.results_uri)}/{run_id}", None, "shared"
    if spec.results_uri:
        return spool_root, f"{spec.results_uri}/{run_id}", "ship"
    if spec.shared_results is True:
        if not seen:
            raise ClusterError(
                f"shared_results is true, but generator {info['generator']} on "
                f"{info.get('host')} ({info.get('node_ip')}) does not see {out_root}"
            )
        return out_root, None, "direct"
    if spec.shared_results is None and seen:
        return out_root, None, "direct"
    return spool_root, None, "spool"


def gather_parts(
    run_dir: Path, rel_dir: str, info: dict[str, Any], results_uri: str | None = None, run_id: str | None = None
) -> dict[str, int]:
    """Bring one generator's part files under ``rel_dir`` into ``run_dir``; returns counts.

    From the shared URI first (nothing through Ray), then anything still missing from the generator's host
    through a task pinned to that node (this works after the generator actor died, while its node lives).
    Spooled copies that arrived are removed from the generator's host.
    """
    run_dir = Path(run_dir)
    dest_dir = run_dir / rel_dir
    have = {p.name for p in dest_dir.glob(PART_GLOB)} if dest_dir.exists() else set()
    counts = {"from_uri": 0, "from_host": 0, "removed": 0}
    mode = info.get("output_mode", "direct")
    if mode == "direct":
        return counts
    if results_uri and run_id:
        try:
            fs, base, _ = spool.open_uri(
                spool.local_path(results_uri) if not spool.is_remote_uri(results_uri) else results_uri
            )
            src = f"{base}/{run_id}/{rel_dir}"
            for name in spool.list_parts(fs, src):
                if name not in have:
                    atomic_write(dest_dir / name, spool.read(fs, f"{src}/{name}"))
                    have.add(name)
                    counts["from_uri"] += 1
        except Exception:  # the driver may not reach the URI: fall back to the generator's host
            pass
    node, root = info.get("node_id"), info.get("spool_root")
    if node and root and Path(root).resolve() != run_dir.resolve():
        listed = list_node_files(node, root, rel_dir)
        missing = [r for r in listed if Path(r).name not in have]
        for rel, data in read_node_files(node, root, missing):
            atomic_write(run_dir / rel, data)
            have.add(Path(rel).name)
            counts["from_host"] += 1
        if mode in ("spool", "ship"):
            counts["removed"] = remove_node_files(node, root, [r for r in listed if Path(r).name in have])
    return counts
