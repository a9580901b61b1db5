"""scripts/wheelhouse.py: the offline install's pure parts (no index, no network): what a target already has, and
Ray's wheel slimmed with a RECORD that lists exactly what is left (pip installs from RECORD)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import sys
import zipfile
from pathlib import Path

from support import REPO

ROOT = REPO
_spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
assert _spec and _spec.loader
wheelhouse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheelhouse)


def test_have_lists_read_from_pip_freeze_list_or_names(tmp_path):
    f = tmp_path / "have.txt"
    f.write_text(
        "# comment\nPackage    Version\n---------- -------\nnumpy==2.5.2\nPyYAML 6.0.4\n"
        "typing_extensions>=4\nnvidia-ml-py\ntorch @ file:///x.whl\n\n"
    )
    assert wheelhouse.read_have(f) == {"numpy", "pyyaml", "typing-extensions", "nvidia-ml-py", "torch"}
    assert wheelhouse.read_have(None) == set()


def test_wheel_names_are_canonical():
    assert wheelhouse.wheel_name(Path("typing_extensions-4.16.0-py3-none-any.whl")) == "typing-extensions"
    assert wheelhouse.wheel_name(Path("ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl")) == "ray"


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_a_slimmed_wheel_keeps_the_rest_and_records_exactly_it(tmp_path):
    whl = tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
    files = {
        "ray/__init__.py": b"x = 1\n",
        "ray/jars/ray.jar": b"J" * 1000,
        "ray/rllib/a.py": b"r",
        "ray/dashboard/client/main.js": b"js",
        "ray/dashboard/client/main.js.map": b"m" * 500,
    }
    with zipfile.ZipFile(whl, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("ray-2.60.0.dist-info/RECORD", "\n".join(f"{n},{_digest(d)},{len(d)}" for n, d in files.items()))
    before, after = wheelhouse.slim_wheel(whl, wheelhouse.RAY_DROP)
    assert after < before
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        assert names == {"ray/__init__.py", "ray/dashboard/client/main.js", "ray-2.60.0.dist-info/RECORD"}
        rows = [r.split(",") for r in z.read("ray-2.60.0.dist-info/RECORD").decode().splitlines()]
        listed = {r[0]: r for r in rows}
        assert set(listed) == names
        for name in names - {"ray-2.60.0.dist-info/RECORD"}:
            data = z.read(name)
            assert listed[name][1:] == [_digest(data), str(len(data))]
        assert listed["ray-2.60.0.dist-info/RECORD"][1:] == ["", ""]


def test_install_refuses_an_empty_wheelhouse(tmp_path, capsys):
    assert wheelhouse.main(["install", str(tmp_path)]) == 2
    assert "no wheels" in capsys.readouterr().err


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


parts = _load("wheelhouse_parts")
engine = _load("wheelhouse_engine")


def _wheel(dirpath: Path, name: str, files: dict[str, bytes], requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) that pip installs."""
    dist = f"{name}-1.0.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        **files,
        f"{dist}/METADATA": meta.encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    whl = dirpath / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr(
            f"{dist}/RECORD", "".join(f"{n},{_digest(d)},{len(d)}\n" for n, d in files.items()) + f"{dist}/RECORD,,\n"
        )
    return whl


def test_parts_pack_split_verify_and_install(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    import os

    noise = os.urandom(6000)  # incompressible, so the stream needs several 2 kB parts
    wheels = [
        _wheel(src, "alpha", {"alpha/__init__.py": b"X = 1\n", "alpha/blob.bin": noise}),
        _wheel(src, "beta", {"beta/__init__.py": b"Y = 2\n"}),
    ]
    wh = tmp_path / "wh"
    manifest = parts.pack(wheels, wh, 2000, {"engine": "toy"})
    assert len(manifest["parts"]) >= 3 and all(p["bytes"] <= 2000 for p in manifest["parts"])
    assert manifest["engine"] == "toy" and [w["name"] for w in manifest["wheels"]] == sorted(w.name for w in wheels)
    target = tmp_path / "site"
    assert wheelhouse.main(["install", str(wh), "--target", str(target)]) == 0
    assert (target / "alpha" / "__init__.py").read_text() == "X = 1\n" and (target / "beta").is_dir()


def test_a_damaged_or_missing_part_is_named_and_nothing_installed(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    import os

    wh = tmp_path / "wh"
    parts.pack([_wheel(src, "alpha", {"alpha/blob.bin": os.urandom(5000)})], wh, 2000)
    first = wh / "wheels.tar.xz.part000"
    first.write_bytes(b"x" + first.read_bytes()[1:])
    assert wheelhouse.main(["install", str(wh), "--target", str(tmp_path / "site")]) == 2
    assert "part000: damaged" in capsys.readouterr().err and not (tmp_path / "site").exists()
    (wh / "wheels.tar.xz.part001").unlink()
    assert wheelhouse.main(["install", str(wh), "--target", str(tmp_path / "site")]) == 2
    assert "parts missing: wheels.tar.xz.part001" in capsys.readouterr().err


def test_engine_plan_leaves_what_the_node_has_ships_clashes_and_stops_at_its_gpu_stack():
    closure = [
        engine.Resolved("sglang", "0.5.17", ["torch==2.11.0", "transformers==5.12.1", "numpy", "orjson>=3"]),
        engine.Resolved("torch", "2.11.0", ["nvidia-cudnn-cu13==9.1"]),
        engine.Resolved("nvidia-cudnn-cu13", "9.1", []),  # torch's: the node that keeps torch has it
        engine.Resolved("transformers", "5.12.1", ["numpy>=1.17"]),
        engine.Resolved("numpy", "2.6.0", []),  # pip's newest; the node's 2.5.2 satisfies every requirement
        engine.Resolved("orjson", "3.13.0", []),
    ]
    have = {"torch": "2.11.0", "transformers": "5.17.0", "numpy": "2.5.2"}
    p = engine.plan(closure, have, "3.12", roots={"sglang"})
    assert [r.name for r in p.ship] == ["orjson", "sglang", "transformers"]
    assert p.left_out == ["numpy 2.5.2", "torch 2.11.0"]
    assert p.clashes == [
        "transformers: the node has 5.17.0, the closure needs transformers==5.12.1: 5.12.1 shipped, "
        "in front of the node's on PYTHONPATH"
    ]
    assert p.blockers == []
    p = engine.plan(closure, have, "3.12", roots={"sglang"}, leave_out=frozenset({"orjson"}))
    assert [r.name for r in p.ship] == [
        "sglang",
        "transformers",
    ] and "orjson 3.13.0 (left out: --leave-out)" in p.left_out
    p = engine.plan(closure, {**have, "torch": "2.13.0"}, "3.12", roots={"sglang"})
    assert p.blockers == ["torch: the node has 2.13.0, the closure needs torch==2.11.0"]


def test_engine_trims_other_gpu_architectures_static_libs_and_lists_them(tmp_path):
    whl = _wheel(
        tmp_path,
        "sglang_kernel",
        {
            "sgl_kernel/__init__.py": b"",
            "sgl_kernel/common_ops.abi3.so": b"S" * 100,
            "sgl_kernel/sm100/common_ops.abi3.so": b"B" * 300,
            "sgl_kernel/flash_ops.abi3.so": b"F" * 200,
            "sgl_kernel/lib/libx.a": b"A" * 50,
        },
    )
    out = tmp_path / "out.whl"
    lines = engine.trim_and_store(whl, engine.trim_rules("sglang-kernel", "sm90"), out)
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    assert "sgl_kernel/common_ops.abi3.so" in names and "sgl_kernel/sm100/common_ops.abi3.so" not in names
    assert "sgl_kernel/flash_ops.abi3.so" not in names and "sgl_kernel/lib/libx.a" not in names
    assert len(lines) == 3 and any("architectures other than sm90" in ln for ln in lines)


def test_an_extra_the_closure_asks_for_is_shipped_with_what_it_brings():
    """vLLM 0.26 requires fastapi[standard]: uvicorn comes in only through that extra (the GPU image has fastapi's
    neighbours but no uvicorn), so a plan that evaluated every marker with no extra left the server unable to start."""
    closure = [
        engine.Resolved("vllm", "0.26.0", ["fastapi[standard]<0.137", "torch==2.11.0"]),
        engine.Resolved("fastapi", "0.136.3", ["starlette>=1", 'uvicorn[standard]>=0.12; extra == "standard"']),
        engine.Resolved("starlette", "1.10.0", []),
        engine.Resolved("uvicorn", "0.40.0", ["h11>=0.8", 'httptools>=0.6; extra == "standard"']),
        engine.Resolved("h11", "0.16.0", []),
        engine.Resolved("httptools", "0.7.1", []),
        engine.Resolved("torch", "2.11.0", []),
        engine.Resolved("rich", "14.0.0", ['pygments; extra == "jupyter"']),  # an extra nobody asks for
        engine.Resolved("pygments", "2.19.0", []),
    ]
    p = engine.plan(closure, {"torch": "2.11.0"}, "3.12", roots={"vllm"})
    assert [r.name for r in p.ship] == ["fastapi", "h11", "httptools", "starlette", "uvicorn", "vllm"]


def test_vllms_flashattention_2_is_trimmed_only_where_fa3_serves(tmp_path):
    """vLLM imports each FlashAttention build in its own try: on sm90 FA3 serves and FA2's 305 MB stay behind; on
    sm80 FA2 is the one that serves and stays."""
    files = {
        "vllm/__init__.py": b"",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"2" * 300,
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"3" * 200,
        "vllm/third_party/fmha_sm100/include/x.hpp": b"h" * 10,
    }
    kept = {}
    for arch in ("sm90", "sm80", "sm100"):
        out = tmp_path / f"{arch}.whl"
        engine.trim_and_store(_wheel(tmp_path, "vllm", files), engine.trim_rules("vllm", arch), out)
        with zipfile.ZipFile(out) as z:
            kept[arch] = {n.rsplit("/", 1)[-1] for n in z.namelist()}
    assert "_vllm_fa2_C.abi3.so" not in kept["sm90"] and "_vllm_fa3_C.abi3.so" in kept["sm90"]
    assert {"_vllm_fa2_C.abi3.so", "_vllm_fa3_C.abi3.so"} <= kept["sm80"]
    assert "x.hpp" in kept["sm100"] and "x.hpp" not in kept["sm90"]


def test_have_versions_from_pip_freeze_and_list(tmp_path):
    f = tmp_path / "freeze.txt"
    f.write_text("# c\nPackage Version\n------- -------\ntorch==2.11.0\nPyYAML 6.0.2\nnvidia-ml-py\n")
    assert engine.read_have_versions(f) == {"torch": "2.11.0", "pyyaml": "6.0.2", "nvidia-ml-py": None}
