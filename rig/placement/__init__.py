"""Ray connection, node discovery, pre-flight checks and placement of the server and load generators, clock
offsets, files on nodes and the gathering of part files: one module per job. Every way the cluster can fall short
is a ``ClusterError`` with a one-line message."""

from rig.placement.clocks import best_offset, host_clocks, measure_clock_offset
from rig.placement.connection import connect, session_dir
from rig.placement.discovery import ClusterLayout, RayNode, describe_nodes
from rig.placement.errors import ClusterError, PlacementError
from rig.placement.gather import gather_parts, output_for, set_outputs
from rig.placement.node_files import list_node_files, read_node_files, remove_node_files
from rig.placement.plan import NODE_ID_LABEL, Placement, plan_placement, release, verify_generators, wait_started

__all__ = [
    "NODE_ID_LABEL",
    "ClusterError",
    "ClusterLayout",
    "Placement",
    "PlacementError",
    "RayNode",
    "best_offset",
    "connect",
    "describe_nodes",
    "gather_parts",
    "host_clocks",
    "list_node_files",
    "measure_clock_offset",
    "output_for",
    "plan_placement",
    "read_node_files",
    "release",
    "remove_node_files",
    "session_dir",
    "set_outputs",
    "verify_generators",
    "wait_started",
]
