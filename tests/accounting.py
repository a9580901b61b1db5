"""The accounting invariant every integration test checks: scheduled = records written, request ids unique."""

from pathlib import Path

from rig.results import read_manifest, read_requests


def assert_accounting(run_dir: Path) -> None:
    m = read_manifest(run_dir)
    t = read_requests(run_dir, columns=["point", "request_id", "status"]).to_pandas()
    assert not t.duplicated(["point", "request_id"]).any(), "duplicate request ids within a point"
    assert set(t.status.unique()) <= {"ok", "failed", "cancelled"}
    for p in m["points"]:
        rows = t[t.point == p["point"]]
        counts = {k: int((rows.status == k).sum()) for k in ("ok", "failed", "cancelled")}
        assert counts == p["records"], (p["point"], counts, p["records"])
        assert p["requests_scheduled"] == len(rows), (p["point"], p["requests_scheduled"], len(rows))
