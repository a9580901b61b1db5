"""An engine's wheel closure for a node that has part of it already (the build side of scripts/wheelhouse.py).

    python3 scripts/wheelhouse.py build WH --engine 'sglang==0.5.17' --have node-freeze.txt \\
        --python-version 3.12 [--gpu-arch sm90] [--part-size-mb 60] [--pip-arg=--find-links=DIR ...]

1. pip resolves the engine for the node's interpreter and platform (``pip install --dry-run --report``), nothing
   installed here.
2. Each resolved package is compared with the node's (``--have``: ``pip freeze`` output, versions read): a package the
   node has at a version every requirement on it in the closure accepts stays behind, whatever version pip picked;
   one it lacks is shipped; one it has at a version some requirement refuses is a **clash**, resolved on purpose and
   reported: shipped, to shadow the node's on PYTHONPATH (transformers 5.12.1 over the image's 5.17 for SGLang
   0.5.17), except packages bound to the node's GPU stack (torch, triton, the CUDA libraries), which cannot be
   shadowed: those stop the build (``--allow-clash`` ships nothing for them and goes on).
3. Wheels are trimmed (each trim listed with its bytes and why: GPU code for other architectures, another vendor's
   backends, static libraries, parts known to be unused), stored uncompressed, packed as one xz stream and cut into
   parts with a manifest of checksums (scripts/wheelhouse_parts.py), which ``install`` verifies.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

try:  # the build side runs where pip works, and pip carries packaging
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover
    from pip._vendor.packaging.markers import default_environment  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

# Bound to the node's GPU stack: a different build cannot be put in front of the node's (ABI, CUDA runtime).
# What SGLang 0.5.17 declares and a node serving Llama-family models with triton attention never imported (seen on
# the H200, 2026-12-02): `--leave-out sglang-0.5.17` names them all.
LEAVE_OUT_PRESETS = {
    "sglang-0.5.17": (
        "tokenspeed-triton",
        "tokenspeed-mla",
        "nvidia-cutlass-dsl",
        "nvidia-cutlass-dsl-libs-cu12",
        "nvidia-cutlass-dsl-libs-base",
        "tilelang",
        "z3-solver",
        "nvidia-mathdx",
        "numba",
        "torchao",
        "torchcodec",
        "mistral-common",
        "helion",
        "openai-harmony",
        "modelscope",
        "anthropic",
        "numpy",
    ),
    # What vLLM 0.26.0 declares that a node serving a Llama-family model with ngram or a draft model should never
    # import, read from its source (not yet checked on a node, unlike SGLang's list): the MLA, video, audio, MCP,
    # Anthropic-API and OTLP-export extras and the kernels of other architectures' fast paths.
    "vllm-0.26.0": (
        "tilelang",
        "z3-solver",
        "nvidia-cutlass-dsl",
        "nvidia-cutlass-dsl-libs-cu13",
        "nvidia-cutlass-dsl-libs-base",
        "tokenspeed-mla",
        "torchcodec",
        "pynvvideocodec",
        "anthropic",
        "mcp",
        "quack-kernels",
        "humming-kernels",
        "fastsafetensors",
        "opentelemetry-exporter-otlp",
        "opentelemetry-exporter-otlp-proto-grpc",
        "opentelemetry-exporter-otlp-proto-http",
        "grpcio",
    ),
}
NODE_BOUND = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*|pytorch-triton.*)$")

# (wheel name, member pattern, why): what engines' wheels carry that a given node never loads.
TRIMS: tuple[tuple[str, str, str], ...] = (
    ("sglang-kernel", r"^sgl_kernel/flash_ops", "FlashAttention-3 kernels, 1.1 GB (use --attention-backend triton)"),
    ("sglang-kernel", r"^sgl_kernel/infllm_ops", "InfLLM kernels (unused by the campaign's models)"),
    ("sglang-kernel", r"^sgl_kernel/flashmla_ops", "FlashMLA kernels (MLA models only)"),
    ("xgrammar", r"\.a$", "a static library (nothing links against it at run time)"),
    ("ray", r"^ray/jars/", "Java workers"),
    ("ray", r"^ray/rllib/", "RLlib"),
    ("ray", r"\.map$", "the dashboard's source maps"),
    ("*", r"(^|/)[^/]+\.a$", "a static library"),
    ("*", r"(^|/)(rocm|hip|xpu|npu|habana|neuron)(/|_ops).*\.(so|cubin|fatbin|hsaco)$", "another vendor's backend"),
)
# (wheel name, member pattern, why, the node architectures it applies to): what a node of that GPU never loads.
ARCH_TRIMS: tuple[tuple[str, str, str, frozenset[int]], ...] = (
    # vllm/vllm_flash_attn/flash_attn_interface.py imports each FlashAttention build in its own try: FA3 serves sm90
    ("vllm", r"^vllm/vllm_flash_attn/_vllm_fa2_C", "FlashAttention-2, 305 MB (FA3 serves sm90)", frozenset({90})),
    ("vllm", r"^vllm/third_party/fmha_sm100/", "Blackwell's FMHA sources (sm100 only)", frozenset({80, 86, 89, 90})),
)
# Generic rules and the architecture filter drop native code only: Python modules stay, since a package may import
# another vendor's module unconditionally and only then check the device.
NATIVE = re.compile(r"\.(so(\.\d+)*|cubin|fatbin|ptx|a)$")
ARCH_DIRS = re.compile(r"(^|/)(sm_?(\d{2,3})a?)(/|_|\.)")  # e.g. sgl_kernel/sm100/, *_sm90a.so


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_have_versions(path: Path | None) -> dict[str, str | None]:
    """``pip freeze`` / ``pip list`` output: name -> version (None where the line gives none)."""
    out: dict[str, str | None] = {}
    if path is None:
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.lower().startswith(("package ", "---")):
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\s*==\s*([^\s;]+)|\s+([0-9][^\s]*))?", line)
        if m:
            out[canonical(m[1])] = m[2] or m[3]
    return out


@dataclass
class Resolved:
    name: str
    version: str
    requires: list[str]  # Requires-Dist lines


@dataclass
class Plan:
    ship: list[Resolved] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # "name version (the node's)"
    clashes: list[str] = field(default_factory=list)  # shipped on purpose, shadowing the node's
    blockers: list[str] = field(default_factory=list)  # bound to the node, cannot be shadowed


def resolve(engine: list[str], python_version: str, platforms: list[str], pip_args: list[str]) -> list[Resolved]:
    """pip's resolution of ``engine`` for the node's interpreter (metadata only, nothing installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--only-binary=:all:",
            "--implementation",
            "cp",
            "--python-version",
            python_version,
            "--target",
            str(Path(tmp) / "t"),
            "--report",
            str(report),
            *pip_args,
        ]
        for p in platforms:
            cmd += ["--platform", p]
        subprocess.run([*cmd, *engine], check=True)
        data = json.loads(report.read_text())
    return [
        Resolved(
            canonical(i["metadata"]["name"]), i["metadata"]["version"], list(i["metadata"].get("requires_dist") or [])
        )
        for i in data["install"]
    ]


def _requirements_by_package(closure: list[Resolved], python_version: str) -> dict[str, list[Requirement]]:
    """Each resolved package's own requirements that apply on the node (markers evaluated, with the extras other
    packages of the closure ask of it)."""
    env = {
        **default_environment(),
        "python_version": python_version,
        "python_full_version": python_version + ".0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
    }
    names = {r.name for r in closure}
    parsed: dict[str, list[Requirement]] = {}
    for r in closure:
        for line in r.requires:
            try:
                parsed.setdefault(r.name, []).append(Requirement(line))
            except InvalidRequirement:
                continue
    # The extras the closure asks of each package (vLLM's fastapi[standard] brings uvicorn): a package's lines under
    # `extra == "x"` apply when something that applies asks for x. Repeated until no new extra turns up.
    extras: dict[str, set[str]] = {}

    def applies(req: Requirement, owner: str) -> bool:
        wanted = ("", *sorted(extras.get(owner, ())))
        return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in wanted)

    while True:
        before = sum(len(v) for v in extras.values())
        for owner, reqs in parsed.items():
            for req in reqs:
                if req.extras and applies(req, owner):
                    extras.setdefault(canonical(req.name), set()).update(req.extras)
        if sum(len(v) for v in extras.values()) == before:
            break
    out: dict[str, list[Requirement]] = {}
    for owner, reqs in parsed.items():
        for req in reqs:
            if applies(req, owner) and canonical(req.name) in names:
                out.setdefault(owner, []).append(req)
    return out


def _requirements_on(closure: list[Resolved], python_version: str) -> dict[str, list[Requirement]]:
    """Every requirement in the closure on each package, by the required package's name."""
    out: dict[str, list[Requirement]] = {}
    for reqs in _requirements_by_package(closure, python_version).values():
        for req in reqs:
            out.setdefault(canonical(req.name), []).append(req)
    return out


def _needed(closure: list[Resolved], roots: set[str], kept: set[str], python_version: str) -> set[str]:
    """Packages reachable from ``roots`` without passing through one the node keeps: the node has that one's own
    requirements already (torch's CUDA libraries, say), so they are neither shipped nor judged."""
    by_name = {r.name: r for r in closure}
    edges = {
        name: {canonical(q.name) for q in qs} for name, qs in _requirements_by_package(closure, python_version).items()
    }
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        if name not in kept:
            todo.extend(edges.get(name, ()))
    return seen


def plan(
    closure: list[Resolved],
    have: dict[str, str | None],
    python_version: str,
    roots: set[str] | None = None,
    leave_out: frozenset[str] = frozenset(),
) -> Plan:
    """What to ship, what the node's own packages cover, and each clash (see the module docstring). ``leave_out``:
    packages the engine declares but the node's use never imports (nor what only they need), by the user's word."""
    reqs = _requirements_on(closure, python_version)
    kept = {r.name for r in closure if r.name in have and _node_serves(r.name, have[r.name], reqs)}
    kept |= {canonical(n) for n in leave_out}
    wanted = {r.name for r in closure} if roots is None else _needed(closure, roots, kept, python_version)
    out = Plan()
    for r in sorted(closure, key=lambda x: x.name):
        if r.name not in wanted:
            continue
        if r.name in {canonical(n) for n in leave_out}:
            out.left_out.append(f"{r.name} {r.version} (left out: --leave-out)")
            continue
        if r.name not in have:
            out.ship.append(r)
            continue
        node = have[r.name]
        refusing = [str(q) for q in reqs.get(r.name, []) if node is not None and not _accepts(q, node)]
        if node is not None and not refusing:
            out.left_out.append(f"{r.name} {node}")
        elif node is None:
            out.left_out.append(f"{r.name} (the node's, version not given)")
        elif NODE_BOUND.match(r.name):
            out.blockers.append(f"{r.name}: the node has {node}, the closure needs {'; '.join(refusing)}")
        else:
            out.ship.append(r)
            out.clashes.append(
                f"{r.name}: the node has {node}, the closure needs {'; '.join(refusing)}: "
                f"{r.version} shipped, in front of the node's on PYTHONPATH"
            )
    return out


def _node_serves(name: str, node: str | None, reqs: dict[str, list[Requirement]]) -> bool:
    return node is None or all(_accepts(q, node) for q in reqs.get(name, []))


def _accepts(req: Requirement, version: str) -> bool:
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def trim_rules(name: str, gpu_arch: str | None) -> list[tuple[object, str]]:
    rules = [(re.compile(p), why) for w, p, why in TRIMS if w in ("*", name)]
    if gpu_arch:
        arch = int(re.sub(r"\D", "", gpu_arch))
        rules += [(re.compile(p), why) for w, p, why, archs in ARCH_TRIMS if w == name and arch in archs]
        rules.append(
            (_ArchFilter(int(re.sub(r"\D", "", gpu_arch))), f"GPU code for architectures other than {gpu_arch}")
        )
    return rules


class _ArchFilter:
    """Matches members under an sm_XX directory or suffix whose XX is not the node's architecture."""

    def __init__(self, keep: int) -> None:
        self.keep = keep

    def search(self, member: str) -> bool:
        if not NATIVE.search(member):
            return False
        return any(int(m[3]) != self.keep for m in ARCH_DIRS.finditer(member))


def trim_and_store(whl: Path, rules: list, out: Path) -> list[str]:
    """Rewrite ``whl`` into ``out`` stored (no compression), without the members a rule matches; RECORD lists
    exactly what is left. Returns one line per rule that dropped something."""
    import base64
    import hashlib

    dropped: dict[str, list[int]] = {}
    with zipfile.ZipFile(whl) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in zin.infolist():
            if info.filename == record:
                continue
            why = next((w for p, w in rules if p.search(info.filename)), None)
            if why is not None:
                dropped.setdefault(why, []).append(info.file_size)
                continue
            data = zin.read(info)
            zout.writestr(info, data, compress_type=zipfile.ZIP_STORED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        rows.append(f"{record},,")
        zout.writestr(record, "\n".join(rows) + "\n")
    return [f"{whl.name}: {len(v)} files, {sum(v) / 1e6:.1f} MB: {why}" for why, v in dropped.items()]
