"""Connecting to Ray: start a local one (the embedded default) or join a cluster, failing fast with one line."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import ray

from rig.config import ClusterSpec
from rig.placement.discovery import ClusterLayout, describe_nodes
from rig.placement.errors import ClusterError


class _RayInitOptions(TypedDict):
    """ray.init's keywords shared by a local start and a join."""

    include_dashboard: bool
    logging_level: int
    log_to_driver: bool
    configure_logging: bool


def connect(spec: ClusterSpec, n_generators: int) -> ClusterLayout:
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
