"""Real source code found on this machine at run time (the Python standard library by default), read deterministically.

Code prompts and agent tool outputs quote real code so speculative decoding sees real code, not filler. Nothing is
downloaded or shipped: the files are whatever this interpreter's stdlib holds, so prompts are identical on machines
with the same Python version (build the sessions once, on the driver, and ship them to the generators).
"""

from __future__ import annotations

import bisect
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rig.workloads.errors import WorkloadError

_SUFFIXES = (".py", ".c", ".h", ".cc", ".cpp", ".rs", ".go", ".java", ".js", ".ts")
# Third-party packages (site-packages) differ per machine; the test suite and demos are huge and atypical.
_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "__pycache__",
    "test",
    "tests",
    "idlelib",
    "turtledemo",
    ".git",
    "node_modules",
    ".venv",
    "venv",
    "pydoc_data",
    "encodings",
}  # pydoc_data: one string blob; encodings: generated charmap tables
_MIN_BYTES = 1024  # tiny files (empty __init__.py and the like) make poor excerpts


@dataclass(frozen=True)
class SourceTree:
    """The eligible files of one source tree, sorted by (size, path) so 'files of at least N bytes' is a suffix."""

    root: str
    paths: tuple[str, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class Excerpt:
    """A contiguous run of whole lines from one file."""

    path: str  # relative to the tree's root
    first_line: int  # 1-based
    text: str


def stdlib_root() -> str:
    """This interpreter's standard-library directory."""
    return sysconfig.get_paths()["stdlib"]


@lru_cache(maxsize=8)
def source_tree(root: str | None = None) -> SourceTree:
    """List the eligible source files under ``root`` (default: the stdlib) in a deterministic order."""
    base = os.path.realpath(root or stdlib_root())
    if not os.path.isdir(base):
        raise WorkloadError(f"code_dir {base}: not a directory")
    found: list[tuple[int, str]] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for f in filenames:
            if f.endswith(_SUFFIXES):
                full = os.path.join(dirpath, f)
                try:
                    size = os.path.getsize(full)
                except OSError:
                    continue
                if size >= _MIN_BYTES:
                    found.append((size, os.path.relpath(full, base).replace(os.sep, "/")))
    if not found:
        raise WorkloadError(
            f"code_dir {base}: no source files of at least {_MIN_BYTES} bytes; set code_dir or code_fraction: 0"
        )
    found.sort()
    return SourceTree(base, tuple(p for _, p in found), tuple(s for s, _ in found))


@lru_cache(maxsize=8)
def tree_fingerprint(root: str | None = None) -> dict[str, object]:
    """What a source tree holds, in one digest (every eligible file's path and bytes): equal digests on two hosts
    mean code prompts built from one seed are identical there."""
    tree = source_tree(root)
    h = hashlib.sha256()
    for rel in tree.paths:
        h.update(rel.encode() + b"\0")
        with open(os.path.join(tree.root, rel), "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    return {"root": tree.root, "files": len(tree.paths), "sha256": h.hexdigest()[:16], "default": root is None}


@lru_cache(maxsize=1024)
def read_source(root: str, path: str) -> str:
    """One file's text (undecodable bytes replaced, so any file reads)."""
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
        return fh.read()


@lru_cache(maxsize=1024)
def source_lines(root: str, path: str) -> tuple[tuple[str, ...], np.ndarray]:
    """One file's lines (with line ends) and the running character count at the end of each."""
    lines = tuple(read_source(root, path).splitlines(keepends=True))
    return lines, np.cumsum([len(x) for x in lines], dtype=np.int64)


def pick_file(tree: SourceTree, rng: np.random.Generator, min_chars: int = 0) -> str:
    """A seeded choice among files of at least ``min_chars`` bytes (the largest file if none is that big)."""
    start = min(bisect.bisect_left(tree.sizes, min_chars), len(tree.paths) - 1)
    return tree.paths[start + int(rng.integers(len(tree.paths) - start))]


def excerpt(tree: SourceTree, rng: np.random.Generator, target_chars: int, path: str | None = None) -> Excerpt:
    """About ``target_chars`` of whole lines from a seeded file (or ``path``) at a seeded start line."""
    rel = path or pick_file(tree, rng, target_chars)
    lines, ends = source_lines(tree.root, rel)  # ends[i]: chars up to and including line i
    total = int(ends[-1]) if len(ends) else 0
    # Latest start that still leaves target_chars of text; draw the start uniformly up to it.
    starts_ok = int(np.searchsorted(ends, total - target_chars, side="right")) if total > target_chars else 0
    first = int(rng.integers(starts_ok + 1)) if starts_ok > 0 else 0
    before = int(ends[first - 1]) if first > 0 else 0
    last = int(np.searchsorted(ends, before + target_chars, side="left"))
    text = "".join(lines[first : last + 1])
    return Excerpt(rel, first + 1, text)


@lru_cache(maxsize=1024)
def names_defined_in(root: str, path: str) -> tuple[str, ...]:
    """``names_defined`` of one whole file (cached: an agent session names one of its focus file's)."""
    return tuple(names_defined(read_source(root, path)))


def names_defined(text: str) -> list[str]:
    """Function and class names defined in a Python excerpt (for task wording and grep patterns)."""
    out = []
    for line in text.splitlines():
        stripped = line.lstrip()
        for kw in ("def ", "class ", "async def "):
            if stripped.startswith(kw):
                name = stripped[len(kw) :].split("(")[0].split(":")[0].strip()
                if name.isidentifier():
                    out.append(name)
                break
    return out
