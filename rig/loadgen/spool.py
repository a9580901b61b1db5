"""Where a generator's part files go when the driver's results directory is not on its host.

- a local spool directory on the generator's own host (the driver gathers it through Ray at the end of a point);
- a shared path (NFS) or an object-store URI opened with ``pyarrow.fs.FileSystem.from_uri``.

The crash-safe rule holds everywhere: on a filesystem a part is written as ``.tmp`` and renamed; on an object
store a single put is atomic (the object appears whole when the stream is closed, or not at all).
"""

from __future__ import annotations

import contextlib
import posixpath
from pathlib import Path
from typing import TypedDict

import pyarrow.fs as pafs

from rig.results import PART_GLOB, is_part_name


def fill(template: str, host: str, node_ip: str, node_id: str | None) -> str:
    """A path template with {host}, {node_ip}, {node_id} filled in for this host."""
    return template.format(host=host, node_ip=node_ip, node_id=(node_id or "local")[:12])


def open_uri(uri: str) -> tuple[pafs.FileSystem, str, bool]:
    """(filesystem, base path, is_local) of a path or URI; plain paths are local."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).absolute()), True
    fs, base = pafs.FileSystem.from_uri(uri)
    return fs, base.rstrip("/"), isinstance(fs, pafs.LocalFileSystem)


def is_remote_uri(uri: str | None) -> bool:
    """True for object stores and other non-local pyarrow filesystems (s3://, gs://, hdfs://, ...)."""
    if not uri or "://" not in uri:
        return False
    return not uri.startswith("file://")


def local_path(uri: str) -> str:
    """The directory of a local path or file:// URI."""
    return uri[len("file://") :] if uri.startswith("file://") else uri


def put(fs: pafs.FileSystem, path: str, data: bytes, local: bool) -> None:
    """Write one whole file atomically (``.tmp`` + rename on filesystems; a single put on object stores)."""
    if local:
        fs.create_dir(posixpath.dirname(path), recursive=True)
        tmp = path + ".tmp"
        with fs.open_output_stream(tmp) as f:
            f.write(data)
        fs.move(tmp, path)
    else:
        # object stores need no directories (S3 writes a cheap marker); filesystem-like ones do
        with contextlib.suppress(Exception):
            fs.create_dir(posixpath.dirname(path), recursive=True)
        with fs.open_output_stream(path) as f:
            f.write(data)


def read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def list_parts(fs: pafs.FileSystem, directory: str) -> list[str]:
    """Names of the closed part files directly in ``directory`` (none if it does not exist)."""
    sel = pafs.FileSelector(directory, allow_not_found=True, recursive=False)
    names = [posixpath.basename(i.path) for i in fs.get_file_info(sel) if i.type == pafs.FileType.File]
    return sorted(n for n in names if is_part_name(n))


class ShipSummary(TypedDict):
    """What shipping did for a point: added to the generator's report (``GeneratorReport.shipped_parts``)."""

    shipped_parts: int
    ship_errors: list[str]


class Shipper:
    """Copies a generator's closed part files from its spool to a shared URI, each exactly once."""

    def __init__(self, spool_root: Path | str, uri: str):
        self.spool_root = Path(spool_root)
        self.uri = uri
        self.fs, self.base, self.local = open_uri(uri)
        self.shipped: set[str] = set()
        self.errors: list[str] = []

    def check(self) -> str | None:
        """None if the destination takes a write, else why not (a pre-flight probe)."""
        probe = f"{self.base}/.probe-{id(self)}"
        try:
            put(self.fs, probe, b"x", self.local)
            self.fs.delete_file(probe)
            return None
        except Exception as e:  # OSError, ArrowIOError, auth errors from the object store
            return f"{self.uri}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"

    def ship(self, rel_dir: str) -> int:
        """Ship every closed part under spool_root/rel_dir not shipped yet; returns how many were shipped now."""
        d = self.spool_root / rel_dir
        if not d.exists():
            return 0
        n = 0
        for p in sorted(d.glob(PART_GLOB)):
            rel = f"{rel_dir}/{p.name}"
            if rel in self.shipped:
                continue
            try:
                put(self.fs, f"{self.base}/{rel}", p.read_bytes(), self.local)
            except Exception as e:
                self.errors.append(f"{rel}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
                continue  # the spool keeps it; the driver gathers it through Ray
            self.shipped.add(rel)
            n += 1
        return n

    def summary(self) -> ShipSummary:
        return ShipSummary(shipped_parts=len(self.shipped), ship_errors=self.errors[-3:])
