"""The engine's log is capped (rig/server/log_sink.py): the head whole, a rotating tail, a line for what is cut."""

from __future__ import annotations

import os
import subprocess
import sys

from rig.server.log_sink import LogSink

# An engine that logs a startup line, then floods its output (41 MB in 7 s was seen), then says why it stops.
CHATTY = (
    "import sys\n"
    "print('max_total_num_tokens=100, ready', flush=True)\n"
    "for i in range(20000): print(f'debug line {i:06d} ' + 'x' * 80)\n"
    "print('the last words', flush=True)\n"
)


def test_a_flood_of_output_keeps_the_head_and_the_tail_and_says_what_it_left_out(tmp_path):
    log = tmp_path / "server.log"
    sink = LogSink(log, head_bytes=4096, tail_bytes=8192)
    proc = subprocess.Popen([sys.executable, "-c", CHATTY], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sink.start(proc.stdout)
    assert proc.wait(timeout=60) == 0
    sink.join(10)
    written = len("max_total_num_tokens=100, ready\n") + 20000 * 99 + len("the last words\n")
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert on_disk <= 4096 + 2 * 8192  # the head and two tail files, whatever the engine wrote
    text = sink.text()
    assert text.startswith("max_total_num_tokens=100, ready\n")
    assert text.rstrip().endswith("the last words")
    lines = text.splitlines()
    cut = [i for i, line in enumerate(lines) if line.startswith("[rig: server.log capped")]
    assert len(cut) == 1
    # whole lines on both sides of the cut, numbered in order, and the count of what is missing is exact
    before, after = lines[1 : cut[0]], lines[cut[0] + 1 : -1]
    assert all(len(line) == 98 for line in before + after)
    numbers = [int(line.split()[2]) for line in before + after]
    assert numbers == sorted(numbers) and numbers[0] == 0 and numbers[-1] == 19999
    left_out = int(lines[cut[0]].split(", ")[1].split()[0].replace(",", ""))
    kept = len(text.encode()) - len(lines[cut[0]]) - 1
    assert kept + left_out == written
    data = sink.close()  # folded into one file
    assert sorted(os.listdir(tmp_path)) == ["server.log"] and log.read_bytes() == data and data.decode() == text


def test_a_quiet_engine_logs_everything_as_it_came(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("an earlier launch\n")  # a resumed run's relaunch appends
    sink = LogSink(log, head_bytes=64, tail_bytes=64)
    proc = subprocess.Popen(
        [sys.executable, "-c", "print('a' * 50); print('b' * 50)"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    sink.start(proc.stdout)
    proc.wait(timeout=60)
    assert sink.close() == b"an earlier launch\n" + b"a" * 50 + b"\n" + b"b" * 50 + b"\n"  # nothing left out: no cut
    assert sorted(os.listdir(tmp_path)) == ["server.log"]


def test_an_engine_that_exits_at_once_has_its_last_words_in_the_error_and_the_log(tmp_path, monkeypatch):
    import asyncio
    import functools

    import pytest

    from rig.server import actor as actor_module
    from rig.server.actor import ServerActor, ServerError
    from rig.server.spec import ServerConfig

    monkeypatch.setattr(actor_module, "LogSink", functools.partial(LogSink, head_bytes=64, tail_bytes=256))
    script = "import sys; print('x' * 2000); print('error: unrecognized arguments: --bogus'); sys.exit(2)"
    cfg = ServerConfig(engine="command", device="cpu", command=(sys.executable, "-c", script, "{port}"))
    actor = ServerActor(cfg, str(tmp_path), "logs/server.log")

    async def go() -> None:
        await actor.start()
        with pytest.raises(ServerError) as e:
            await actor.wait_ready(30)
        assert str(e.value).startswith("command exited with code 2 before it was healthy\n")
        assert str(e.value).splitlines()[-1] == "error: unrecognized arguments: --bogus"
        await actor.stop(5)

    asyncio.run(go())
    log = tmp_path / "logs" / "server.log"
    assert sorted(p.name for p in log.parent.iterdir()) == ["server.log"]  # head and tail folded into one file
    text = log.read_text()
    assert text.endswith("error: unrecognized arguments: --bogus\n") and "bytes left out" in text
    assert len(text) < 64 + 2 * 256 + 200
