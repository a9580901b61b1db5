"""`rig sweep --resume DIR --redo-disturbed`: complete points the measuring host disturbed run again, judged afresh;
clean ones and points flagged for what the server did stay as they are."""

from __future__ import annotations

from click.testing import CliRunner

from rig.cli import cli
from rig.config import build_spec
from rig.contracts import DISTURBED_FLAGS
from rig.results import GPU_METRICS_DIR, REQUESTS_DIR, SERVER_METRICS_DIR
from rig.run.manifest_store import ManifestStore
from rig.run.points import expand_points
from rig.run.rundir import supersede

SUBDIRS = (REQUESTS_DIR, SERVER_METRICS_DIR, GPU_METRICS_DIR)  # a point's own rows


def _finished_run(tmp_path):
    spec = build_spec({}, {"out": str(tmp_path), "run_id": "r", "load": {"concurrency": [1, 4, 16]}, "steps": [4]})
    points = expand_points(spec)
    store = ManifestStore(tmp_path, "closed")
    store.create(spec, points)
    verdicts = [
        {},
        {"sim_behind": "the simulator ran 12 iteration(s) over 0.1 s late", "has_failures": "1 of 8 requests failed"},
        {"server_died": "exit 1"},
    ]
    for p, flags in zip(points, verdicts, strict=True):
        store.update_point(p.point, status="complete")
        store.entry(p.point).set_verdict(flags)
    store.data.status = "complete"
    store.save()
    return points


def test_only_points_the_host_disturbed_run_again(tmp_path):
    points = _finished_run(tmp_path)
    clean, disturbed, died = (p.point for p in points)
    store = ManifestStore(tmp_path, "closed")
    assert not store.finished_on_disk(points, DISTURBED_FLAGS)  # something to redo: the run is not finished
    store.resume(points, DISTURBED_FLAGS)
    e = store.entry(disturbed)
    assert e.status == "pending" and e.flags == [] and e.flag_reasons == {}  # judged afresh when it runs
    assert e.rerun == "flagged sim_behind" and e.error is None  # why it runs again; not an error of the point
    assert store.entry(clean).status == "complete"
    # a server that died is the system under test's doing, not the host's: measured again it would only repeat it
    assert store.entry(died).status == "complete" and store.entry(died).flags == ["server_died"]


def test_without_redo_a_finished_run_stays_finished(tmp_path):
    points = _finished_run(tmp_path)
    store = ManifestStore(tmp_path, "closed")
    assert store.finished_on_disk(points)  # no rows were written, and none were counted: all on disk
    store.resume(points)
    assert [store.entry(p.point).status for p in points] == ["complete"] * 3


def test_redo_needs_a_run_to_resume():
    res = CliRunner().invoke(cli, ["sweep", "--redo-disturbed", "--steps", "4"])
    assert res.exit_code == 2 and "give it with --resume DIR" in res.output


def test_a_redone_points_earlier_rows_and_gpu_samples_are_moved_aside(tmp_path):
    [_, disturbed, _] = _finished_run(tmp_path)
    old = [tmp_path / sub / f"point={disturbed.point}" / "part-0.parquet" for sub in SUBDIRS]
    for f in old:
        f.parent.mkdir(parents=True)
        f.write_bytes(b"first attempt")
    supersede(tmp_path, disturbed.point)  # what run_point does before the new attempt writes
    assert not any(f.exists() for f in old)
    moved = sorted(f.parent.parent.name for f in (tmp_path / "superseded").rglob("part-0.parquet"))
    assert moved == sorted(SUBDIRS)
