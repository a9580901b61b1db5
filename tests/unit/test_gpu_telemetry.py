"""The GPU sampler (rig/server/gpu_telemetry.py) against a pynvml double with NVML's names, units and errors
(tests/doubles/fake_pynvml.py, after nvidia-ml-py's pynvml.py)."""

from __future__ import annotations

import sys
import time

import pyarrow.parquet as pq
import pytest
from doubles.fake_pynvml import FakeGpu, FakeNvml

from rig.results import GPU_METRICS_SCHEMA, PartWriter, read_gpu_metrics
from rig.server.gpu_telemetry import (
    GpuSample,
    GpuSampler,
    NvmlSource,
    TelemetryAbsent,
    assigned_devices,
    import_nvml,
    open_source,
)


def node(n: int = 4, **kw) -> FakeNvml:
    return FakeNvml([FakeGpu(uuid=f"GPU-{i:04d}-aaaa", **kw) for i in range(n)])


def test_a_sample_row_and_the_samplers_keys_are_the_parquet_schema():
    """The typed row (GpuSample) plus what the sampler adds are every column of gpu_metrics, none more."""
    added = {"run_id", "point", "node", "ts", "source", "sample_s"}
    assert set(GpuSample.__annotations__) | added == set(GPU_METRICS_SCHEMA.names)
    assert not set(GpuSample.__annotations__) & added


def test_assigned_devices_follow_cuda_visible_devices_then_ray():
    assert assigned_devices("2,3", ["0"]) == ["2", "3"]  # what Ray set for the actor wins
    assert assigned_devices("GPU-0003-aaaa,GPU-0001-aaaa", []) == ["GPU-0003-aaaa", "GPU-0001-aaaa"]
    assert assigned_devices("1,-1,2", []) == ["1"]  # CUDA stops at the first invalid entry
    assert assigned_devices("", ["0"]) == []  # set but empty: no device visible
    assert assigned_devices(None, ["0", "1"]) == ["0", "1"]
    assert assigned_devices(None, []) == []


def test_devices_map_to_nvml_indices_by_index_and_by_uuid():
    fake = node()
    src = NvmlSource.open(["GPU-0003-aaaa", "1"], fake.module())
    assert [(g["index"], g["uuid"], g["cuda_device"]) for g in src.gpus] == [
        (3, "GPU-0003-aaaa", "GPU-0003-aaaa"),
        (1, "GPU-0001-aaaa", "1"),
    ]
    assert [g["power_limit_mw"] for g in src.gpus] == [700_000, 700_000]
    src.close()
    assert fake.initialized == 0  # nvmlShutdown balanced nvmlInit


def test_sample_reads_every_field_in_nvml_units():
    fake = node(2)
    fake.gpus[1].power_mw, fake.gpus[1].energy_mj, fake.gpus[1].util_gpu = 612_345, 9_876_543, 97
    fake.gpus[1].event_reasons = 0x4  # SwPowerCap
    src = NvmlSource.open(["1"], fake.module())
    [row] = src.sample()
    assert row == {
        "gpu_index": 1,
        "gpu_uuid": "GPU-0001-aaaa",
        "gpu_name": "NVIDIA H200",
        "power_limit_mw": 700_000,
        "power_mw": 612_345,
        "energy_mj": 9_876_543,
        "util_gpu_pct": 97,
        "util_mem_pct": 0,
        "mem_used_bytes": 1 << 30,
        "mem_total_bytes": 141 << 30,
        "sm_clock_mhz": 345,
        "temperature_c": 30,
        "throttle_reasons": 0x4,
        "errors": None,
    }


def test_a_field_the_gpu_does_not_support_is_null_and_named():
    fake = node(1)
    fake.gpus[0].unsupported = {"nvmlDeviceGetTotalEnergyConsumption"}  # pre-Volta: no energy counter
    [row] = NvmlSource.open(["0"], fake.module()).sample()
    assert row["energy_mj"] is None and row["power_mw"] == 80_000
    assert row["errors"] == "energy_mj: Not Supported"


def test_no_driver_library_is_absent_with_the_reason():
    fake = FakeNvml([FakeGpu(uuid="GPU-x")], library=False)
    with pytest.raises(
        TelemetryAbsent, match="NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    ):
        NvmlSource.open(["0"], fake.module())


def test_no_gpu_assigned_and_mig_and_unknown_uuid_are_absent():
    with pytest.raises(TelemetryAbsent, match="no GPU assigned"):
        open_source("sglang", "http://x", [], nvml=node().module())
    fake = node()
    with pytest.raises(TelemetryAbsent, match="MIG instance"):
        NvmlSource.open(["MIG-1234"], fake.module())
    assert fake.initialized == 0
    with pytest.raises(TelemetryAbsent, match="NVMLError_NotFound"):
        NvmlSource.open(["GPU-nope"], fake.module())
    assert fake.initialized == 0


def test_the_simulators_gpus_are_read_into_rows_and_a_malformed_answer_is_absent(monkeypatch):
    """SimulatedSource reads GET /sim/gpu (rig/sim/server.py sim_gpu) into the same rows NVML gives; an answer
    without a GPU's uuid is no telemetry, with the reason."""
    import io
    import json
    import urllib.request

    gpu = {
        "index": 0,
        "uuid": "GPU-SIM-00000000",
        "name": "sim",
        "power_mw": 412_000,
        "energy_mj": 7,
        "util_gpu_pct": 50,
    }
    gpu |= {"util_mem_pct": 10, "mem_used_bytes": 5, "mem_total_bytes": 9, "power_limit_mw": 600_000}
    gpu |= {"sm_clock_mhz": None, "temperature_c": None, "throttle_reasons": None}
    answer = {"source": "simulated", "gpus": [gpu, {**gpu, "index": 1, "uuid": "GPU-SIM-00000001"}]}
    monkeypatch.setattr(urllib.request, "urlopen", lambda req, timeout: io.BytesIO(json.dumps(answer).encode()))
    src = open_source("sim", "http://127.0.0.1:1", [])
    assert src.source == "simulated"
    assert src.gpus[1] == {"index": 1, "uuid": "GPU-SIM-00000001", "name": "sim", "power_limit_mw": 600_000}
    row = src.sample()[0]
    assert row == {
        "gpu_index": 0,
        "gpu_uuid": "GPU-SIM-00000000",
        "gpu_name": "sim",
        "power_limit_mw": 600_000,
        "power_mw": 412_000,
        "energy_mj": 7,
        "util_gpu_pct": 50,
        "util_mem_pct": 10,
        "mem_used_bytes": 5,
        "mem_total_bytes": 9,
        "sm_clock_mhz": None,
        "temperature_c": None,
        "throttle_reasons": None,
        "errors": None,
    }
    del answer["gpus"][0]["uuid"]
    with pytest.raises(TelemetryAbsent, match="did not answer: KeyError"):
        open_source("sim", "http://127.0.0.1:1", [])


def test_missing_pynvml_is_absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(TelemetryAbsent, match="pynvml .nvidia-ml-py. is not importable"):
        import_nvml()


def test_sampler_writes_gpu_metrics_rows_bracketing_the_window(tmp_path):
    fake = node(2)
    src = NvmlSource.open(["0", "1"], fake.module())
    writer = PartWriter(tmp_path / "gpu_metrics" / "point=p1", GPU_METRICS_SCHEMA, max_age_s=60)
    sampler = GpuSampler(src, writer, {"run_id": "r", "point": "p1", "node": "10.0.0.5"}, interval_s=0.05)
    sampler.start()
    time.sleep(0.2)
    for g in fake.gpus:
        g.energy_mj += 5_000
    stats = sampler.stop()
    t = read_gpu_metrics(tmp_path).to_pylist()
    assert stats.samples >= 3 and stats.failed == 0 and stats.rows == len(t) == 2 * stats.samples
    assert {r["source"] for r in t} == {"nvml"} and {r["node"] for r in t} == {"10.0.0.5"}
    assert {r["gpu_index"] for r in t} == {0, 1}
    last = [r for r in t if r["gpu_index"] == 0][-1]
    assert last["energy_mj"] == 1_005_000  # the closing round saw the counter after the change
    assert (
        pq.read_schema(next((tmp_path / "gpu_metrics" / "point=p1").glob("part-*.parquet"))).names
        == GPU_METRICS_SCHEMA.names
    )


def test_a_failing_round_is_counted_not_fatal(tmp_path):
    class Flaky:
        source = "simulated"
        gpus: list = []
        n = 0

        def sample(self):
            self.n += 1
            if self.n == 1:
                raise OSError("connection refused")
            return [{"gpu_index": 0, "gpu_uuid": "GPU-SIM-0", "gpu_name": "x", "power_mw": 1, "errors": None}]

        def close(self):
            pass

    writer = PartWriter(tmp_path / "g", GPU_METRICS_SCHEMA)
    s = GpuSampler(Flaky(), writer, {"run_id": "r", "point": "p", "node": "n"}, 10.0)
    s.sample_once()
    s.sample_once()
    writer.close()
    assert (s.stats.samples, s.stats.failed, s.stats.last_error) == (1, 1, "OSError: connection refused")


def test_a_disk_that_stays_full_costs_the_rows_not_the_point(tmp_path, monkeypatch):
    """The sampler's stop survives a part writer that still cannot write after its retries: the rows it could not
    write are counted and the error named; nothing raises into the point's end."""
    fake = node(1)
    src = NvmlSource.open(["0"], fake.module())
    writer = PartWriter(tmp_path / "gpu_metrics" / "point=p1", GPU_METRICS_SCHEMA, max_age_s=60)
    sampler = GpuSampler(src, writer, {"run_id": "r", "point": "p1", "node": "n"}, interval_s=10.0)
    sampler.sample_once()

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "close", full)
    stats = sampler.stop()
    assert stats.rows_unwritten == writer.pending == 2
    assert stats.last_error == "gpu_metrics not written: No space left on device"


def test_the_server_actor_records_why_telemetry_is_absent(tmp_path, monkeypatch):
    """Outside Ray, on this machine: no GPU assigned; with one named, the real pynvml finds no driver library."""
    import asyncio

    import rig.server.actor as actor_module
    from rig.server.actor import ServerActor
    from rig.server.spec import ServerConfig

    pynvml = pytest.importorskip("pynvml")
    # outside Ray even when an earlier test of this process left a Ray instance up (the node's address would differ)
    monkeypatch.setattr(actor_module.ray, "is_initialized", lambda: False)
    actor = ServerActor(ServerConfig(engine="sglang"), str(tmp_path), "server.log")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    got = asyncio.run(actor.open_telemetry())
    assert got.source is None and got.absent_reason.startswith("no GPU assigned to the server actor")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    got = asyncio.run(actor.open_telemetry())
    assert got.model_dump(exclude_unset=True) == {
        "source": None,
        "node_ip": "127.0.0.1",
        "absent_reason": "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found",
    }
