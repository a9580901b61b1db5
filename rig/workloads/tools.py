"""Tool-output-like text for agent sessions, built from real source files and our own phrases, to a size target.

Each function returns (call, body): ``call`` is how the agent would have invoked the tool, ``body`` is about
``n_chars`` of output. Everything is drawn from the given generator, so a session's outputs are reproducible.
"""

from __future__ import annotations

import numpy as np

from rig.workloads import corpus, source
from rig.workloads.source import SourceTree

_MAX_LINE = 160  # grep and logs truncate long lines, as real tools do
_GREP_FILES = 40  # files searched per pattern: bounds the cost of a rare pattern (real agents grep a subtree)


def read_file(tree: SourceTree, rng: np.random.Generator, n_chars: int, path: str) -> tuple[str, str]:
    """Numbered lines of ``path`` (``cat -n`` style)."""
    # Line numbers add about 8 characters per line (~40 chars): take a little less raw text.
    ex = source.excerpt(tree, rng, max(100, int(n_chars * 0.84)), path=path)
    lines = ex.text.splitlines()
    body = "\n".join(f"{ex.first_line + k:6d}\t{line}" for k, line in enumerate(lines))
    return f"read_file({path!r}, {ex.first_line}, {ex.first_line + len(lines) - 1})", body


def grep(tree: SourceTree, rng: np.random.Generator, n_chars: int, pattern: str) -> tuple[str, str]:
    """``path:line:text`` matches of ``pattern`` across files, from a seeded starting file, until ``n_chars``."""
    out: list[str] = []
    size = 0
    start = int(rng.integers(len(tree.paths)))
    # Fall back to common Python tokens if the chosen name is rare: real greps also return long generic lists.
    for pat in (pattern, "def ", "return ", "import "):
        for k in range(min(_GREP_FILES, len(tree.paths))):
            path = tree.paths[(start + k) % len(tree.paths)]
            if pat not in source.read_source(tree.root, path):
                continue  # one C-speed search skips a file without a match (the line loop costs ~6 ms a session)
            for n, line in enumerate(source.source_lines(tree.root, path)[0], 1):
                if pat in line:
                    hit = f"{path}:{n}:{line.strip()[:_MAX_LINE]}"
                    out.append(hit)
                    size += len(hit) + 1
                    if size >= n_chars:
                        return f"grep({pattern!r}, '.')", "\n".join(out)
    return f"grep({pattern!r}, '.')", "\n".join(out)


def list_dir(tree: SourceTree, rng: np.random.Generator, n_chars: int) -> tuple[str, str]:
    """A recursive listing (size and path) from a seeded starting point, until ``n_chars``."""
    start = int(rng.integers(len(tree.paths)))
    out: list[str] = []
    size = 0
    for k in range(len(tree.paths)):
        j = (start + k) % len(tree.paths)
        line = f"{tree.sizes[j]:>9}  {tree.paths[j]}"
        out.append(line)
        size += len(line) + 1
        if size >= n_chars:
            break
    return "list_dir('.', recursive=True)", "\n".join(out)


def run_tests(tree: SourceTree, rng: np.random.Generator, n_chars: int, path: str) -> tuple[str, str]:
    """A pytest-like log: PASSED/FAILED lines, then failures quoting real lines of ``path``, then a summary."""
    text = corpus.agent_text()
    names, failures = text.test_names, text.failure_messages
    module = path.rsplit("/", 1)[-1].removesuffix(".py")
    src = source.read_source(tree.root, path).splitlines()
    n_tests = int(rng.integers(8, 40))
    failed = sorted({int(x) for x in rng.integers(0, n_tests, size=int(rng.integers(1, 4)))})
    head = [
        "=" * 29 + " test session starts " + "=" * 30,
        "platform linux -- Python 3.11, pytest-8.3",
        f"collected {n_tests} items",
        "",
    ]
    results = [
        f"tests/test_{module}.py::{names[t % len(names)]}_{t} {'FAILED' if t in failed else 'PASSED'}"
        f" [{100 * (t + 1) // n_tests:3d}%]"
        for t in range(n_tests)
    ]
    lines = head + results + ["", "=" * 36 + " FAILURES " + "=" * 36]
    size = sum(len(x) + 1 for x in lines)
    k = 0
    while size < n_chars:  # as many failure sections as the size calls for, each quoting real code
        t = failed[k % len(failed)]
        at = int(rng.integers(max(1, len(src) - 12)))
        block = ["_" * 20 + f" {names[t % len(names)]}_{t} " + "_" * 20, ""]
        block += [f"    {line[:_MAX_LINE]}" for line in src[at : at + 8]]
        block += [
            f">   {src[min(at + 8, len(src) - 1)][:_MAX_LINE]}" if src else ">",
            f"E   {failures[int(rng.integers(len(failures)))]}",
            "",
            f"{path}:{at + 9}: in {module}",
            "",
        ]
        lines += block
        size += sum(len(x) + 1 for x in block)
        k += 1
    lines.append(
        f"{'=' * 20} {len(failed)} failed, {n_tests - len(failed)} passed in "
        f"{float(rng.uniform(0.5, 30)):.2f}s {'=' * 20}"
    )
    return f"run_tests('tests/test_{module}.py')", "\n".join(lines)
