"""Files on a node, through Ray tasks pinned to it: list, read and remove (they work after the actor that wrote the
files died, while its node lives)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TypedDict

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rig.results import PART_GLOB


class _OnNode(TypedDict):
    """Ray task options that pin a task to one node."""

    num_cpus: int
    scheduling_strategy: NodeAffinitySchedulingStrategy
    max_retries: int


def _on_node(node_id: str) -> _OnNode:
    return _OnNode(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), max_retries=0)


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
