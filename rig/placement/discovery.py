"""Node discovery: the alive nodes of the connected Ray cluster, with their labels and resources."""

from __future__ import annotations

import ray
from pydantic import BaseModel, ConfigDict, Field


class RayNode(BaseModel):
    """One alive node as placement sees it (Ray's own ``ray.io/`` labels and bookkeeping resources left out)."""

    model_config = ConfigDict(extra="forbid")

    node_id: str
    ip: str | None = None
    hostname: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    cpus: float = 0
    gpus: float = 0
    resources: dict[str, float] = Field(default_factory=dict)


class ClusterLayout(BaseModel):
    """The connected cluster: Ray's version, its alive nodes, and where this driver runs (the manifest records it)."""

    model_config = ConfigDict(extra="forbid")

    ray_version: str
    nodes: list[RayNode] = Field(default_factory=list)
    driver_node: str | None = None
    driver_ip: str | None = None


def describe_nodes() -> ClusterLayout:
    """The alive nodes of the connected cluster and where this driver runs."""
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        nodes.append(
            RayNode(
                node_id=n["NodeID"],
                ip=n.get("NodeManagerAddress"),
                hostname=n.get("NodeManagerHostname"),
                labels={k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith("ray.io/")},
                cpus=res.get("CPU", 0),
                gpus=res.get("GPU", 0),
                resources={k: v for k, v in res.items() if not k.startswith(("node:", "memory", "object_store"))},
            )
        )
    try:
        driver_node = ray.get_runtime_context().get_node_id()
    except Exception:
        driver_node = None
    return ClusterLayout(
        ray_version=ray.__version__, nodes=nodes, driver_node=driver_node, driver_ip=ray.util.get_node_ip_address()
    )
