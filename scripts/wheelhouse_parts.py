"""A wheelhouse as one xz stream cut into parts of a given size, with a manifest of checksums (stdlib only).

Why: a node with no package index receives files through channels with a size limit per transfer (the device
tool here carries 64 MiB a call; a USB key or an upload form elsewhere). Wheels are zip files, each compressed on
its own; stored (uncompressed) and packed into one xz stream they compress far better (SGLang 0.5.17's 52 wheels:
351 MB stored, 57.5 MB as one xz -9 stream). ``pack`` writes ``wheels.tar.xz.partNNN`` and ``parts.json``;
``unpack`` checks each part and the whole against the manifest, then extracts the wheels and checks each of them.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

MANIFEST = "parts.json"
STREAM = "wheels.tar.xz"


class PartsError(Exception):
    """A part missing or damaged, or a wheel that does not match the manifest: one line, for the user."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _xz(tar_path: Path, out: Path) -> None:
    """xz -9 of the tar: the xz program on all cores when there is one, else Python's lzma (one core)."""
    if shutil.which("xz"):
        with out.open("wb") as f:
            subprocess.run(["xz", "-9", "-T0", "-c", str(tar_path)], stdout=f, check=True)
        return
    with tar_path.open("rb") as src, lzma.open(out, "wb", preset=9) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def pack(wheels: list[Path], out_dir: Path, part_bytes: int, extra: dict | None = None) -> dict:
    """Pack ``wheels`` into ``out_dir`` as parts of at most ``part_bytes``; returns the manifest it wrote."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "wheels.tar"
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
            for w in sorted(wheels, key=lambda p: p.name):
                tar.add(w, arcname=w.name)
        stream = Path(tmp) / STREAM
        _xz(tar_path, stream)
        parts = []
        with stream.open("rb") as f:
            for i, block in enumerate(iter(lambda: f.read(part_bytes), b"")):
                part = out_dir / f"{STREAM}.part{i:03d}"
                part.write_bytes(block)
                parts.append({"name": part.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
        manifest = {
            "stream": {"name": STREAM, "bytes": stream.stat().st_size, "sha256": sha256(stream)},
            "parts": parts,
            "wheels": [{"name": w.name, "bytes": w.stat().st_size, "sha256": sha256(w)} for w in sorted(wheels)],
            **(extra or {}),
        }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def unpack(wh: Path, into: Path) -> list[Path]:
    """Check every part, reassemble, check the whole, extract the wheels into ``into`` and check each one."""
    manifest = json.loads((wh / MANIFEST).read_text())
    missing = [p["name"] for p in manifest["parts"] if not (wh / p["name"]).is_file()]
    if missing:
        raise PartsError(f"{wh}: {len(missing)} of {len(manifest['parts'])} parts missing: {', '.join(missing)}")
    for p in manifest["parts"]:
        got = sha256(wh / p["name"])
        if got != p["sha256"]:
            raise PartsError(
                f"{wh / p['name']}: damaged (sha256 {got[:12]}..., the manifest says {p['sha256'][:12]}...)"
            )
    into.mkdir(parents=True, exist_ok=True)
    stream = into / STREAM
    with stream.open("wb") as out:
        for p in manifest["parts"]:
            with (wh / p["name"]).open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    if sha256(stream) != manifest["stream"]["sha256"]:
        raise PartsError(f"{wh}: the reassembled stream does not match the manifest (parts from two builds?)")
    with tarfile.open(stream, "r:xz") as tar:
        tar.extractall(into, filter="data")
    stream.unlink()
    wheels = []
    for w in manifest["wheels"]:
        path = into / w["name"]
        if not path.is_file() or sha256(path) != w["sha256"]:
            raise PartsError(f"{path}: missing or not the wheel the manifest lists")
        wheels.append(path)
    return wheels
