"""Placement of the server and the load generators, and the checks that they landed where they should.

Placement rules:
- the server asks for its GPUs (that is what sets CUDA_VISIBLE_DEVICES) plus the server label and/or resource;
- generators get a hard per-host guarantee: either a count resource (each client host advertises ``client: 1`` and
  each generator takes ``1 / per_host`` of it) or a STRICT_SPREAD placement group over the client label;
- unless allowed, generators are kept off the server node(s) by a ``ray.io/node-id`` label selector.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rig.config import ClusterSpec
from rig.contracts import GeneratorInfo
from rig.placement.discovery import RayNode
from rig.placement.errors import PlacementError

NODE_ID_LABEL = "ray.io/node-id"


class ActorOptions(TypedDict, total=False):
    """What an actor is created with (``Actor.options(**opts)``, ray.actor.ActorClass.options): the keys rig sets."""

    num_cpus: float
    num_gpus: float
    resources: dict[str, float]
    label_selector: dict[str, str]
    scheduling_strategy: PlacementGroupSchedulingStrategy


@dataclass
class Placement:
    """How to create the server actor and each generator actor."""

    server_options: ActorOptions
    generator_options: list[ActorOptions]
    server_node: str | None
    client_nodes: list[str]
    local: bool
    placement_group: Any = None
    server_nodes: list[str] = field(default_factory=list)
    per_host: int = 1
    allow_on_server: bool = True


def _matches(node: RayNode, label: dict[str, str], resource: str | None) -> bool:
    if label and any(node.labels.get(k) != v for k, v in label.items()):
        return False
    return not resource or node.resources.get(resource, 0) > 0


def _describe_selector(label: dict[str, str], resource: str | None) -> str:
    parts = [f"label {k}={v}" for k, v in label.items()] + ([f"resource {resource!r}"] if resource else [])
    return " and ".join(parts) or "any node"


def _exclude(node_ids: Iterable[str]) -> dict[str, str]:
    ids = sorted(set(node_ids))
    return {NODE_ID_LABEL: f"!in({','.join(ids)})"} if ids else {}


def plan_placement(
    spec: ClusterSpec, nodes: list[RayNode], n_gpus: int, n_generators: int, timeout_s: float | None = None
) -> Placement:
    """Pre-flight: check the nodes can host the server and the generators, and say how to place them."""
    if n_generators < 1:
        raise PlacementError("at least one load generator is needed (--clients >= 1)")
    if spec.address is None:
        return _plan_local(spec, nodes, n_gpus, n_generators)
    timeout_s = timeout_s if timeout_s is not None else spec.placement_timeout_s
    server_opts, server_ids = _plan_server(spec, nodes, n_gpus)
    avoid = [] if spec.allow_generators_on_server_node else server_ids
    clients = _client_hosts(spec, nodes, avoid, n_generators)
    gen_opts, pg = _generator_options(spec, avoid, n_generators, timeout_s)
    return Placement(
        server_opts,
        gen_opts,
        server_ids[0] if len(server_ids) == 1 else None,
        [c.node_id for c in clients],
        local=False,
        placement_group=pg,
        server_nodes=server_ids,
        per_host=spec.per_host,
        allow_on_server=spec.allow_generators_on_server_node,
    )


def _plan_local(spec: ClusterSpec, nodes: list[RayNode], n_gpus: int, n_generators: int) -> Placement:
    """One machine (the embedded default): everything on the local node."""
    have = nodes[0].gpus if nodes else 0
    if n_gpus and have and have < n_gpus:
        raise PlacementError(f"the server needs {n_gpus} GPUs; this machine has {have:g}")
    return Placement(
        # Ask Ray for the GPUs when the machine has them (that sets CUDA_VISIBLE_DEVICES); the sim needs none.
        server_options={"num_cpus": 0, "num_gpus": n_gpus if have else 0},
        generator_options=[{"num_cpus": 1} for _ in range(n_generators)],
        server_node=nodes[0].node_id if nodes else None,
        client_nodes=[nodes[0].node_id] * n_generators if nodes else [],
        local=True,
        server_nodes=[nodes[0].node_id] if nodes else [],
        per_host=max(n_generators, spec.per_host),
    )


def _plan_server(spec: ClusterSpec, nodes: list[RayNode], n_gpus: int) -> tuple[ActorOptions, list[str]]:
    """The server actor's options and the nodes that can host it."""
    servers = [n for n in nodes if _matches(n, spec.server_label, spec.server_resource)]
    if n_gpus and not (spec.server_label or spec.server_resource):
        servers = [n for n in servers if n.gpus > 0]
    if not servers:
        raise PlacementError(
            f"no alive node has {_describe_selector(spec.server_label, spec.server_resource)} "
            f"for the server ({len(nodes)} nodes in the cluster)"
        )
    if n_gpus and not any(n.gpus >= n_gpus for n in servers):
        best = max(n.gpus for n in servers)
        raise PlacementError(f"the server needs {n_gpus} GPUs on one node; the server node(s) have at most {best:g}")
    if n_gpus:
        servers = [n for n in servers if n.gpus >= n_gpus]
    server_cpus = 1 if any(n.cpus >= 1 for n in servers) else 0
    server_opts: ActorOptions = {"num_cpus": server_cpus, "num_gpus": n_gpus}
    if spec.server_label:
        server_opts["label_selector"] = dict(spec.server_label)
    if spec.server_resource:
        server_opts["resources"] = {spec.server_resource: 1}
    return server_opts, [s.node_id for s in servers]


def _where(spec: ClusterSpec) -> str:
    """The client hosts asked for, in words (for error messages)."""
    off_server = "" if spec.allow_generators_on_server_node else ", not the server node"
    return _describe_selector(spec.client_label, spec.client_resource) + off_server


def _client_hosts(spec: ClusterSpec, nodes: list[RayNode], avoid: list[str], n_generators: int) -> list[RayNode]:
    """The nodes that may host generators; PlacementError when their slots cannot take ``n_generators``."""
    clients = [n for n in nodes if _matches(n, spec.client_label, spec.client_resource)]
    clients = [n for n in clients if n.node_id not in set(avoid)]
    if not spec.client_label and not spec.client_resource:
        clients = [n for n in clients if n.cpus >= 1]  # e.g. a head started with --num-cpus=0 hosts nothing
    per_host = spec.per_host
    if spec.client_resource:
        # Each generator takes 1/per_host of the host's count resource: a host advertising 1 runs per_host
        # generators, one advertising k runs k * per_host. A hard guarantee: extra generators queue, never double up.
        slots = {n.node_id: int(n.resources.get(spec.client_resource, 0) * per_host + 1e-9) for n in clients}
    else:
        slots = {n.node_id: per_host if n.cpus >= per_host else 0 for n in clients}
    capacity = sum(slots.values())
    if capacity < n_generators:
        hosts = sum(1 for v in slots.values() if v > 0)
        raise PlacementError(
            f"{n_generators} generator(s) asked for, but only {hosts} client host(s) with {_where(spec)} "
            f"x per_host {per_host} = {capacity} slot(s); add client hosts or lower --clients"
        )
    return clients


def _generator_options(
    spec: ClusterSpec, avoid: list[str], n_generators: int, timeout_s: float
) -> tuple[list[ActorOptions], Any]:
    """Each generator actor's options, and the placement group they are spread over (None with a count
    resource)."""
    per_host = spec.per_host
    selector = {**dict(spec.client_label), **_exclude(avoid)}
    if spec.client_resource:
        opts: ActorOptions = {"num_cpus": 0, "resources": {spec.client_resource: 1.0 / per_host}}
        if selector:
            opts["label_selector"] = selector
        return [opts.copy() for _ in range(n_generators)], None
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
            f"client hosts with {_where(spec)} within {timeout_s:g}s (STRICT_SPREAD); "
            f"are their CPUs in use?"
        ) from None
    gen_opts: list[ActorOptions] = [
        {"num_cpus": 1, "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, i // per_host)}
        for i in range(n_generators)
    ]
    return gen_opts, pg


def verify_generators(placement: Placement, gen_info: Sequence[GeneratorInfo]) -> None:
    """After the generators started: each is on an allowed client host, at most per_host per host."""
    if placement.local:
        return
    per_node: dict[str | None, int] = {}  # a generator outside Ray reports no node id
    for info in gen_info:
        node = info.node_id
        per_node[node] = per_node.get(node, 0) + 1
        if not placement.allow_on_server and node in placement.server_nodes:
            raise PlacementError(f"generator {info.generator} landed on the server node {info.node_ip}")
        if placement.client_nodes and node not in placement.client_nodes:
            raise PlacementError(f"generator {info.generator} landed on {info.node_ip}, not a client host")
    crowded = {n: k for n, k in per_node.items() if k > placement.per_host}
    if crowded:
        node, k = next(iter(crowded.items()))
        ip = next(i.node_ip for i in gen_info if i.node_id == node)
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


def release(placement: Placement | None) -> None:
    if placement is not None and placement.placement_group is not None:
        remove_placement_group(placement.placement_group)
