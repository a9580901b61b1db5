"""scripts/wheelhouse.py: the offline install's pure parts (no index, no network): what a target already has, and
Ray's wheel slimmed with a RECORD that lists exactly what is left (pip installs from RECORD)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
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
