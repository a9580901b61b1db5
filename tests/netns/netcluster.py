"""A Ray cluster whose nodes each live in their own Linux network namespace (and UTS namespace, for a hostname).

    switch namespace:  bridge br0  <- one veth per node
    node namespaces:   eth0 with 10.213.0.<k>/24 (a private range that only exists inside these namespaces), lo

Nothing is configured in the machine's own namespace, so all traffic stays between these namespaces. Each node runs
`ray start --block` in its namespace with its own --node-ip-address and --temp-dir. Teardown never uses `ray stop`
(it kills every Ray process on the machine, including other people's): it SIGTERMs the `ray start` processes this
helper started, then SIGKILLs whatever is still inside these namespaces (`ip netns pids`), then deletes them.

Needs root, iproute2 (`ip netns`) and util-linux (`unshare`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
IN_HOST = HERE / "in_host.py"


def _run(argv: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout)


def unavailable() -> str | None:
    """Why this machine cannot build a namespace cluster, or None."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"needs the {tool!r} command"
    probe = f"rigprobe{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe])
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        return f"ip netns is unavailable here: {(getattr(e, 'stderr', '') or str(e)).strip()[:200]}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


@dataclass
class Node:
    name: str
    ip: str
    ray_args: list[str]
    ns: str = ""
    hostname: str = ""
    proc: subprocess.Popen | None = None
    log: Path | None = None


@dataclass
class NetnsCluster:
    """head, server and client nodes; ``up()`` builds the network and starts Ray, ``down()`` removes everything."""

    subnet: str = "10.213.0"
    n_clients: int = 2
    object_store_bytes: int = 80 * 10**6
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rn", dir="/tmp")))  # short: AF_UNIX paths
    nodes: list[Node] = field(default_factory=list)
    tag: str = field(default_factory=lambda: f"rig{os.getpid() % 100000}")
    port: int = 6379

    @property
    def head_ip(self) -> str:
        return f"{self.subnet}.1"

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def _ray(self) -> str:
        return str(Path(self.python).with_name("ray"))

    def _layout(self) -> None:
        common = ["--object-store-memory", str(self.object_store_bytes), "--disable-usage-stats", "--block"]
        join = ["--address", self.address]
        self.nodes = [
            Node(
                "head",
                self.head_ip,
                [
                    "--head",
                    "--port",
                    str(self.port),
                    "--num-cpus",
                    "0",
                    "--include-dashboard",
                    "false",
                    "--labels",
                    "role=head",
                    *common,
                ],
            )
        ]
        self.nodes.append(
            Node(
                "server",
                f"{self.subnet}.2",
                [*join, "--num-cpus", "1", "--num-gpus", "0", "--labels", "role=server", *common],
            )
        )
        for k in range(self.n_clients):
            self.nodes.append(
                Node(
                    f"client{k + 1}",
                    f"{self.subnet}.{3 + k}",
                    [
                        *join,
                        "--num-cpus",
                        "1",
                        "--labels",
                        "role=client",
                        "--resources",
                        json.dumps({"client": 1}),
                        *common,
                    ],
                )
            )
        for n in self.nodes:
            n.ns = f"{self.tag}-{n.name}"
            n.hostname = f"rig-{n.name}"

    # ------------------------------------------------------------------------------------------- network
    def _network(self) -> None:
        _run(["ip", "netns", "add", self.switch])
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for i, n in enumerate(self.nodes):
            _run(["ip", "netns", "add", n.ns])
            inner, outer = f"n{i}", f"p{i}"
            _run(["ip", "-n", self.switch, "link", "add", inner, "type", "veth", "peer", "name", outer])
            _run(["ip", "-n", self.switch, "link", "set", inner, "netns", n.ns])
            _run(["ip", "-n", self.switch, "link", "set", outer, "master", "br0"])
            _run(["ip", "-n", self.switch, "link", "set", outer, "up"])
            _run(["ip", "-n", n.ns, "link", "set", inner, "name", "eth0"])
            _run(["ip", "-n", n.ns, "addr", "add", f"{n.ip}/24", "dev", "eth0"])
            _run(["ip", "-n", n.ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", n.ns, "link", "set", "lo", "up"])

    def exec_argv(self, node: str, argv: list[str]) -> list[str]:
        """argv run inside a node's network namespace, with the node's hostname."""
        n = self.node(node)
        return [
            "ip",
            "netns",
            "exec",
            n.ns,
            "unshare",
            "--uts",
            "--",
            self.python,
            str(IN_HOST),
            n.hostname,
            "--",
            *argv,
        ]

    def full_env(self) -> dict[str, str]:
        return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **self.env}

    # ------------------------------------------------------------------------------------------- ray
    def _start(self, n: Node) -> None:
        n.log = self.base / f"{n.name}.log"
        argv = self.exec_argv(
            n.name,
            [self._ray(), "start", "--node-ip-address", n.ip, "--temp-dir", str(self.base / n.name), *n.ray_args],
        )
        with open(n.log, "wb") as log:
            n.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.full_env(),
                start_new_session=True,
            )

    def _wait_started(self, nodes: list[Node], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = list(nodes)
        while waiting:
            for n in list(waiting):
                text = n.log.read_text(errors="replace") if n.log and n.log.exists() else ""
                if "Ray runtime started" in text:
                    waiting.remove(n)
                elif n.proc is not None and n.proc.poll() is not None:
                    raise RuntimeError(f"ray start on {n.name} exited {n.proc.returncode}:\n{text[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ray start did not finish on {[n.name for n in waiting]} within {timeout_s}s")
            time.sleep(0.2)

    def wait_nodes(self, timeout_s: float = 60) -> list[dict]:
        """From the head namespace, wait until every node is alive in the GCS; returns ray.nodes()."""
        code = (
            "import json, sys, time, ray\n"
            f"ray.init(address={self.address!r}, log_to_driver=False, include_dashboard=False)\n"
            f"deadline = time.monotonic() + {timeout_s}\n"
            "while True:\n"
            "    alive = [n for n in ray.nodes() if n['Alive']]\n"
            f"    if len(alive) >= {len(self.nodes)} or time.monotonic() > deadline: break\n"
            "    time.sleep(0.2)\n"
            "print(json.dumps([{'ip': n['NodeManagerAddress'], 'host': n['NodeManagerHostname'],"
            " 'labels': n['Labels'], 'resources': n['Resources']} for n in alive]))\n"
        )
        out = subprocess.run(
            self.exec_argv("head", [self.python, "-c", code]),
            capture_output=True,
            text=True,
            timeout=timeout_s + 30,
            env=self.full_env(),
        )
        if out.returncode != 0:
            raise RuntimeError(f"cannot list the nodes: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def up(self, timeout_s: float = 90) -> NetnsCluster:
        self._layout()
        try:
            self._network()
            head, rest = self.nodes[0], self.nodes[1:]
            self._start(head)
            self._wait_started([head], timeout_s)
            for n in rest:
                self._start(n)
            self._wait_started(rest, timeout_s)
        except BaseException:
            self.down()
            raise
        return self

    # ------------------------------------------------------------------------------------------- teardown
    def ns_pids(self, ns: str) -> list[int]:
        out = _run(["ip", "netns", "pids", ns], check=False)
        return [int(p) for p in out.stdout.split() if p.strip().isdigit()]

    def down(self, keep_logs: bool = False) -> None:
        """Stop what this helper started and delete its namespaces; safe to call twice or after a failed up()."""
        for n in reversed(self.nodes):
            if n.proc is not None and n.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.proc.pid, signal.SIGTERM)  # ray start --block drains and stops its own processes
        deadline = time.monotonic() + 15
        for n in self.nodes:
            if n.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    n.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        known = set(_run(["ip", "netns", "list"], check=False).stdout.split())
        for ns in [n.ns for n in self.nodes] + [self.switch]:
            if ns not in known:
                continue
            for _ in range(3):  # whatever is still inside one of our namespaces was started by us
                pids = self.ns_pids(ns)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
            _run(["ip", "netns", "del", ns], check=False)  # deleting a namespace deletes its veth ends and bridge
        for n in self.nodes:
            if n.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    n.proc.wait(timeout=5)
        if not keep_logs:
            shutil.rmtree(self.base, ignore_errors=True)

    def logs(self, tail: int = 3000) -> str:
        out = []
        for n in self.nodes:
            if n.log and n.log.exists():
                out.append(f"--- {n.name}\n{n.log.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)
