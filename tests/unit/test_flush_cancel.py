"""A part being written when its level ends is written: cancelling the flush never drops rows it has taken."""

from __future__ import annotations

import asyncio
import threading

from rig.loadgen.flush import Flusher
from rig.results import REQUEST_SCHEMA, PartWriter, empty_record, read_requests


def record(i: int) -> dict:
    rec = empty_record()
    rec.update(run_id="r", point="p", request_id=f"q{i}", status="ok")
    return rec


async def _cancel_while_the_write_is_queued(tmp_path) -> PartWriter:
    writer = PartWriter(tmp_path / "requests" / "point=p" / "gen=0", REQUEST_SCHEMA, max_age_s=0.0)
    flusher = Flusher(writer)
    busy, release = threading.Event(), threading.Event()
    # The writer's one thread is busy (as a nice-19 thread not yet scheduled on a loaded host would be): the part's
    # write waits in the executor's queue when the level ends and the flush task is cancelled.
    flusher.parts.submit(lambda: (busy.set(), release.wait(10)))
    busy.wait(10)
    for i in range(8):
        writer.add(record(i))
    task = asyncio.create_task(flusher.flush_due())
    for _ in range(200):  # the table is built a step at a time on the loop, then the write is queued
        await asyncio.sleep(0)
        if writer.pending == 0 and flusher.parts._work_queue.qsize() > 0:
            break
    assert writer.pending == 0 and flusher.parts._work_queue.qsize() == 1  # taken, queued, not started
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    release.set()
    await flusher.close()
    return writer


def test_rows_taken_by_a_cancelled_flush_are_still_written(tmp_path):
    writer = asyncio.run(_cancel_while_the_write_is_queued(tmp_path))
    assert writer.rows_written == 8 and writer.pending == 0
    assert sorted(read_requests(tmp_path).column("request_id").to_pylist()) == [f"q{i}" for i in range(8)]
