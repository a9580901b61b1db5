"""Ray connection, node discovery, pre-flight checks and placement of the server and load generators."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rig.config import ClusterSpec


class PlacementError(RuntimeError):
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
    notes: list[str] = field(default_factory=list)


def connect(spec: ClusterSpec, n_generators: int) -> dict[str, Any]:
    """Start local Ray (embedded default) or join the cluster at spec.address. Returns a description."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return describe_nodes()
    common = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                  configure_logging=True)
    if spec.address is None:
        # Logical CPUs are just numbers: enough for the server actor and every generator on one machine.
        cpus = spec.num_cpus or max(os.cpu_count() or 1, 1 + n_generators)
        ray.init(address="local", num_cpus=cpus, num_gpus=0, object_store_memory=spec.object_store_memory_mb * 2**20,
                 **common)
    else:
        ray.init(address=spec.address, **common)
    return describe_nodes()


def describe_nodes() -> dict[str, Any]:
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        nodes.append({
            "node_id": n["NodeID"],
            "ip": n.get("NodeManagerAddress"),
            "hostname": n.get("NodeManagerHostname"),
            "labels": {k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith("ray.io/")},
            "cpus": res.get("CPU", 0),
            "gpus": res.get("GPU", 0),
            "resources": {k: v for k, v in res.items() if not k.startswith(("node:", "memory", "object_store"))},
        })
    return {"ray_version": ray.__version__, "nodes": nodes}


def _matches(node: dict[str, Any], label: dict[str, str], resource: str | None) -> bool:
    if label and any(node["labels"].get(k) != v for k, v in label.items()):
        return False
    if resource and node["resources"].get(resource, 0) < 1:
        return False
    return True


def _describe_selector(label: dict[str, str], resource: str | None) -> str:
    parts = [f"label {k}={v}" for k, v in label.items()] + ([f"resource {resource!r}"] if resource else [])
    return " and ".join(parts) or "any node"


def plan_placement(spec: ClusterSpec, nodes: list[dict[str, Any]], n_gpus: int, n_generators: int) -> Placement:
    """Pre-flight: check the nodes can host the server and the generators, and say how to place them."""
    local = spec.address is None
    if local:
        return Placement(
            server_options={"num_cpus": 0, "num_gpus": 0},
            generator_options=[{"num_cpus": 1} for _ in range(n_generators)],
            server_node=nodes[0]["node_id"] if nodes else None,
            client_nodes=[nodes[0]["node_id"]] * n_generators if nodes else [],
            local=True,
        )
    servers = [n for n in nodes if _matches(n, spec.server_label, spec.server_resource)]
    if not servers:
        raise PlacementError(f"no alive node has {_describe_selector(spec.server_label, spec.server_resource)} "
                             f"for the server ({len(nodes)} nodes in the cluster)")
    if n_gpus and not any(n["gpus"] >= n_gpus for n in servers):
        best = max(n["gpus"] for n in servers)
        raise PlacementError(f"the server needs {n_gpus} GPUs on one node; the server node(s) have at most {best:g}")
    server_opts: dict[str, Any] = {"num_cpus": 1, "num_gpus": n_gpus}
    if spec.server_label:
        server_opts["label_selector"] = dict(spec.server_label)
    if spec.server_resource:
        server_opts["resources"] = {spec.server_resource: 1}
    server_node = servers[0]["node_id"] if len(servers) == 1 else None

    clients = [n for n in nodes if _matches(n, spec.client_label, spec.client_resource)]
    if not spec.allow_generators_on_server_node:
        clients = [n for n in clients if n["node_id"] not in {s["node_id"] for s in servers}]
    capacity = len(clients) * spec.per_host
    if capacity < n_generators:
        raise PlacementError(
            f"{n_generators} generators asked for, but only {len(clients)} client host(s) with "
            f"{_describe_selector(spec.client_label, spec.client_resource)} x per_host {spec.per_host} = {capacity}")
    gen_opts: list[dict[str, Any]] = []
    pg = None
    if spec.client_resource:
        # A count resource: each client host advertises per_host, each generator takes 1 (hard guarantee).
        gen_opts = [{"num_cpus": 0, "resources": {spec.client_resource: 1}} for _ in range(n_generators)]
    else:
        hosts = min(len(clients), -(-n_generators // spec.per_host))
        bundle_selector = [dict(spec.client_label)] * hosts if spec.client_label else None
        kwargs: dict[str, Any] = {"strategy": "STRICT_SPREAD"}
        if bundle_selector:
            kwargs["bundle_label_selector"] = bundle_selector
        pg = placement_group([{"CPU": spec.per_host}] * hosts, **kwargs)
        try:
            ray.get(pg.ready(), timeout=60)
        except Exception:
            remove_placement_group(pg)
            raise PlacementError(f"could not spread {hosts} generator bundles over distinct client hosts "
                                 f"within 60s (STRICT_SPREAD)") from None
        gen_opts = [{"num_cpus": 1, "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, i % hosts)}
                    for i in range(n_generators)]
    return Placement(server_opts, gen_opts, server_node, [c["node_id"] for c in clients], local=False,
                     placement_group=pg)


def measure_clock_offset(actor: Any, pings: int = 15) -> tuple[float, float]:
    """(offset, rtt) of an actor's clock against the driver's, from the lowest-RTT of several pings."""
    best: tuple[float, float] | None = None
    for _ in range(pings):
        t0 = time.time()
        t_actor = ray.get(actor.clock.remote())
        t1 = time.time()
        rtt = t1 - t0
        offset = t_actor - (t0 + t1) / 2
        if best is None or rtt < best[1]:
            best = (offset, rtt)
    assert best is not None
    return best


def release(placement: Placement | None) -> None:
    if placement is not None and placement.placement_group is not None:
        remove_placement_group(placement.placement_group)
