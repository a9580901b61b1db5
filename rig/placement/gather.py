"""Where each generator writes its part files, and gathering them into the run directory after each point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from rig.config import ClusterSpec
from rig.contracts import GeneratorEntry, GeneratorInfo
from rig.loadgen import spool
from rig.placement.errors import ClusterError
from rig.placement.node_files import list_node_files, read_node_files, remove_node_files
from rig.results import PART_GLOB, atomic_write


def set_outputs(
    spec: ClusterSpec, run_dir: Path, run_id: str, generators: list[Any], gen_info: list[GeneratorEntry]
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
    plans = [output_for(spec, run_id, out_root, seen, info) for info, seen in zip(gen_info, sees, strict=True)]
    problems = ray.get(
        [g.set_output.remote(root, uri) for g, (root, uri, _) in zip(generators, plans, strict=True)], timeout=120
    )
    for info, (_root, uri, mode), problem in zip(gen_info, plans, problems, strict=True):
        if problem:
            raise ClusterError(
                f"generator {info['generator']} on {info.get('host')} ({info.get('node_ip')}) "
                f"cannot write its results: {problem}"
            )
        info["output_mode"], info["ship_uri"] = mode, uri
    infos = ray.get([g.info.remote() for g in generators])
    for info, now in zip(gen_info, infos, strict=True):
        info["spool_root"] = GeneratorInfo.model_validate(now).spool_root  # filled in for its host


def output_for(
    spec: ClusterSpec, run_id: str, out_root: str, seen: bool, info: GeneratorEntry
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
    run_dir: Path, rel_dir: str, info: GeneratorEntry, results_uri: str | None = None, run_id: str | None = None
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
