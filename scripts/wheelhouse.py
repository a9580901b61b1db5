#!/usr/bin/env python3
"""Install rig on a machine with no package index: build a wheelhouse where pip works, install it where it does not.

    # where pip reaches an index (any OS / Python): wheels for the GPU node's Python and platform
    python3 scripts/wheelhouse.py build WH --python-version 3.12 --platform manylinux2014_x86_64 \\
        [--have have.txt] [--also 'fastapi' --also 'openai==1.109.1' ...] [--slim-ray]
    # on the GPU node (stdlib only; no index needed)
    python3 scripts/wheelhouse.py install WH                 # into this interpreter's environment (pip resolves)
    python3 scripts/wheelhouse.py install WH --target DIR    # unpack every wheel into DIR; then PYTHONPATH=DIR

``build --engine SPEC`` (scripts/wheelhouse_engine.py) makes an engine's closure instead (SGLang, vLLM) for a node
described by its ``pip freeze``: clashes with the node's packages resolved on purpose and reported, wheels trimmed,
recompressed as one xz stream and cut into parts with a checksum manifest (``--part-size-mb``), which ``install``
reassembles and verifies (scripts/wheelhouse_parts.py).

Otherwise ``build`` makes rig's own wheel, then downloads the whole dependency closure of ``rig`` (plus ``--also``
requirements) as binary wheels for the target interpreter. ``--have`` names packages the target already has (one
per line, ``pip freeze`` or ``pip list`` output works; versions are ignored): their wheels are left out, which is
what keeps the wheelhouse small on an image that ships torch, pyarrow and friends. ``--slim-ray`` rewrites Ray's
wheel without the Java jars, RLlib and the dashboard's source maps (79 MB -> ~43 MB; rig uses none of them).

Stdlib only, so the install side runs on a bare interpreter.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its two helper modules
# Parts of Ray's wheel that rig never loads (Java workers, RLlib, dashboard source maps).
RAY_DROP = (re.compile(r"^ray/jars/"), re.compile(r"^ray/rllib/"), re.compile(r"\.map$"))


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> str:
    return canonical(path.name.split("-")[0])


def read_have(path: Path | None) -> set[str]:
    if path is None:
        return set()
    names = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.lower().startswith(("package ", "---")):
            continue
        names.add(canonical(re.split(r"[\s=<>!~\[;@]", line, maxsplit=1)[0]))
    return names


def slim_wheel(src: Path, drop: tuple[re.Pattern[str], ...]) -> tuple[int, int]:
    """Rewrite a wheel in place without the files matching ``drop``; RECORD lists exactly what is left."""
    before = src.stat().st_size
    tmp = src.with_suffix(".slim")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in zin.infolist():
            if info.filename == record_name or any(p.search(info.filename) for p in drop):
                continue
            data = zin.read(info)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        rows.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(rows) + "\n")
    tmp.replace(src)
    return before, src.stat().st_size


def build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", tmp, str(REPO)], check=True)
        rig_wheel = next(Path(tmp).glob("rig-*.whl"))
        platform_args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", args.python_version]
        for p in args.platform:
            platform_args += ["--platform", p]
        # The closure of rig's wheel for the target interpreter, resolved by pip as the target would.
        subprocess.run([*pip, "download", "-q", *platform_args, "-d", str(out), str(rig_wheel), *args.also], check=True)
        shutil.copy2(rig_wheel, out / rig_wheel.name)
    have = read_have(Path(args.have) if args.have else None) - {"rig"}
    dropped = []
    for whl in sorted(out.glob("*.whl")):
        if wheel_name(whl) in have:
            whl.unlink()
            dropped.append(wheel_name(whl))
    if args.slim_ray:
        for whl in out.glob("ray-*.whl"):
            before, after = slim_wheel(whl, RAY_DROP)
            print(f"wheelhouse: {whl.name} slimmed {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB", file=sys.stderr)
    wheels = sorted(out.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    if dropped:
        print(f"wheelhouse: left out (the target has them): {', '.join(sorted(dropped))}", file=sys.stderr)
    print(f"wheelhouse: {len(wheels)} wheels, {total / 1e6:.1f} MB in {out}", file=sys.stderr)
    return 0


def build_engine(args: argparse.Namespace) -> int:
    """An engine's closure for the node (scripts/wheelhouse_engine.py), trimmed, packed into checksummed parts."""
    import wheelhouse_engine as eng
    import wheelhouse_parts as parts

    out = Path(args.out)
    have = eng.read_have_versions(Path(args.have) if args.have else None)
    try:
        closure = eng.resolve([args.engine, *args.also], args.python_version, args.platform, args.pip_arg)
    except subprocess.CalledProcessError:
        print(f"wheelhouse: pip could not resolve {args.engine} for the node (its message is above)", file=sys.stderr)
        return 1
    roots = {eng.canonical(re.split(r"[\s=<>!~\[;@]", r, maxsplit=1)[0]) for r in [args.engine, *args.also]}
    leave = frozenset(n for item in args.leave_out for n in eng.LEAVE_OUT_PRESETS.get(item, (item,)))
    plan = eng.plan(closure, have, args.python_version, roots, leave)
    for line in plan.clashes:
        print(f"wheelhouse: clash: {line}", file=sys.stderr)
    for line in plan.blockers:
        print(f"wheelhouse: cannot ship: {line}", file=sys.stderr)
    if plan.blockers and not args.allow_clash:
        print("wheelhouse: the node's GPU stack does not fit this engine (--allow-clash to go on)", file=sys.stderr)
        return 1
    print(f"wheelhouse: {len(plan.left_out)} packages left to the node, {len(plan.ship)} shipped", file=sys.stderr)
    trims: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        dl, stored = Path(tmp) / "dl", Path(tmp) / "stored"
        stored.mkdir(parents=True)
        platform_args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", args.python_version]
        for p in args.platform:
            platform_args += ["--platform", p]
        pins = [f"{r.name}=={r.version}" for r in plan.ship]
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "-q", "--no-deps"]
        if subprocess.run([*pip, *platform_args, *args.pip_arg, "-d", str(dl), *pins]).returncode:
            print("wheelhouse: pip could not download the closure (its message is above)", file=sys.stderr)
            return 1
        for whl in sorted(dl.glob("*.whl")):
            trims += eng.trim_and_store(whl, eng.trim_rules(wheel_name(whl), args.gpu_arch), stored / whl.name)
        for line in trims:
            print(f"wheelhouse: trimmed {line}", file=sys.stderr)
        extra = {
            "engine": args.engine,
            "clashes": plan.clashes,
            "blockers": plan.blockers,
            "left_to_node": plan.left_out,
            "trims": trims,
        }
        manifest = parts.pack(sorted(stored.glob("*.whl")), out, int(args.part_size_mb * 1e6), extra)
    total = manifest["stream"]["bytes"]
    print(
        f"wheelhouse: {len(manifest['wheels'])} wheels, {total / 1e6:.1f} MB as {len(manifest['parts'])} part(s) "
        f"in {out} ({parts.MANIFEST})",
        file=sys.stderr,
    )
    return 0


def install(args: argparse.Namespace) -> int:
    wh = Path(args.wheelhouse)
    if (wh / "parts.json").is_file():
        import wheelhouse_parts as parts

        unpacked = Path(tempfile.mkdtemp(prefix="wheelhouse-"))
        try:
            parts.unpack(wh, unpacked)
        except parts.PartsError as e:
            print(f"wheelhouse: {e}", file=sys.stderr)
            return 2
        args.wheelhouse = str(unpacked)
        try:
            return install(args)
        finally:
            shutil.rmtree(unpacked, ignore_errors=True)
    wheels = sorted(wh.glob("*.whl"))
    if not wheels:
        print(f"wheelhouse: no wheels in {wh}", file=sys.stderr)
        return 2
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-input",
        "--no-index",
        "--no-cache-dir",
    ]
    if args.target:
        # Every wheel unpacked as it is, nothing resolved: for an interpreter one may not write to.
        cmd = [*pip, "--no-deps", "--no-compile", "--upgrade", "--target", args.target, *map(str, wheels)]
    else:
        requirements = ["rig", *(wheel_name(w) for w in wheels if wheel_name(w) != "rig")]
        cmd = [*pip, "--find-links", str(wh), *requirements]
    done = subprocess.run(cmd)
    if done.returncode == 0 and args.target:
        print(
            f"wheelhouse: installed {len(wheels)} wheels into {args.target}; export PYTHONPATH={args.target}",
            file=sys.stderr,
        )
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download rig's closure as wheels for another interpreter")
    b.add_argument("out")
    b.add_argument("--python-version", default="3.12")
    b.add_argument(
        "--platform",
        action="append",
        default=None,
        help="pip platform tag (repeatable); default: manylinux_2_28 .. manylinux2014 x86_64",
    )
    b.add_argument("--have", help="file naming packages the target already has (left out)")
    b.add_argument("--also", action="append", default=[], help="another requirement to include (repeatable)")
    b.add_argument("--slim-ray", action="store_true", help="drop Ray's jars, RLlib and source maps")
    b.add_argument(
        "--engine", help="an engine's closure instead of rig's, e.g. 'sglang==0.5.17' (wheelhouse_engine.py)"
    )
    b.add_argument("--gpu-arch", help="--engine: keep only this GPU architecture's code, e.g. sm90 (H100/H200)")
    b.add_argument("--part-size-mb", type=float, default=60.0, help="--engine: largest part, MB (default 60)")
    b.add_argument("--allow-clash", action="store_true", help="--engine: go on when the node's torch/CUDA differ")
    b.add_argument(
        "--leave-out",
        action="append",
        default=[],
        help="--engine: a declared package the node never imports (repeatable; 'sglang-0.5.17': the H200's list)",
    )
    b.add_argument("--pip-arg", action="append", default=[], help="passed to pip (e.g. --pip-arg=--find-links=DIR)")
    i = sub.add_parser("install", help="install a wheelhouse with no package index")
    i.add_argument("wheelhouse")
    i.add_argument("--target", help="unpack into this directory (no resolution) instead of this environment")
    args = parser.parse_args(argv)
    if args.cmd == "build" and args.engine and not args.platform:
        # engines' native wheels carry newer glibc tags (llguidance: manylinux_2_39); pip matches each exactly
        args.platform = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64"]
    if args.cmd == "build":
        args.platform = args.platform or [
            "manylinux_2_28_x86_64",
            "manylinux_2_27_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
            "manylinux1_x86_64",
        ]
        return build_engine(args) if args.engine else build(args)
    return install(args)


if __name__ == "__main__":
    sys.exit(main())
