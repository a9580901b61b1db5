"""What `rig run` and `rig sweep` show while they run: one progress bar per point and, on a terminal, a compact live
panel under the running one (requests, tok/s, TTFT and TPOT percentiles so far, the server's gauges). With ``-q``
or when stderr is not a terminal, the output is what it always was: the bars and status lines only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from rig.contracts import PointEntry
from rig.run.live import TOK_S_WINDOW_S, LiveSnapshot
from rig.run.progress import Progress as Callbacks


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    ms = seconds * 1e3
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 1 else f"{ms:.2f} ms"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 10 or float(x).is_integer() else f"{x:.1f}"


def server_line(s: LiveSnapshot) -> str:
    """The server's gauges that it reports (running, queued, speculative steps, generation tok/s, GPU power)."""
    g = s.server
    if g is None:
        return "no answer this beat"
    bits = [
        f"{name} {_num(v)}{unit}"
        for name, v, unit in (
            ("running", g.running, ""),
            ("queued", g.queued, ""),
            ("spec steps", g.spec_steps, ""),
            ("gen", g.gen_throughput, " tok/s"),
            ("power", g.power_w, " W"),
        )
        if v is not None
    ]
    return " · ".join(bits) if bits else "no gauges reported yet"


def live_panel(point: str, s: LiveSnapshot) -> Panel:
    """The live panel of one running level."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    total = f" / {s.scheduled:,}" if s.scheduled else ""
    grid.add_row(
        "requests",
        f"done {s.done:,}{total} · in flight {s.in_flight:,} · failed {s.failed:,} · cancelled {s.cancelled:,}",
    )
    tok_s = f"{s.tok_s:,.0f}" if s.tok_s is not None else "–"
    grid.add_row("tok/s", f"{tok_s} (requests completed in the last {TOK_S_WINDOW_S:g} s)")
    grid.add_row("TTFT", f"p50 {_ms(s.ttft_p50_s)} · p99 {_ms(s.ttft_p99_s)}")
    grid.add_row("TPOT", f"p50 {_ms(s.tpot_p50_s)} · p99 {_ms(s.tpot_p99_s)}")
    grid.add_row("server", server_line(s))
    return Panel(grid, title=f"live · {point} · {s.elapsed_s:.0f} s", title_align="left", expand=False)


class _BarsAndPanel(Progress):
    """rich's Progress with the live panel of the running point under its bars."""

    panel: RenderableType | None = None

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.panel is not None:
            yield self.panel


class ProgressUI:
    """One rich progress bar per point, fed by the driver's polling of the generators; the live panel only on a
    terminal without ``quiet``."""

    def __init__(self, console: Console, quiet: bool) -> None:
        self.console = console
        self.quiet = quiet
        self.live = not quiet and console.is_terminal
        self.progress = _BarsAndPanel(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            disable=quiet,
            transient=False,
        )
        self.task: TaskID | None = None
        self.point: str | None = None

    def __enter__(self) -> ProgressUI:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.panel = None
        self.progress.__exit__(*exc)

    def status(self, msg: str) -> None:
        if not self.quiet:  # a URL's credentials are no more shown than written (rig.results)
            from rig.results import mask_url_credentials

            self.console.log(mask_url_credentials(msg))

    def point_start(self, point: str, total: int | None) -> None:
        self.task = self.progress.add_task(point, total=total, detail="")
        self.point = point

    def point_update(self, done: int, counts: dict[str, int]) -> None:
        if self.task is not None:
            detail = f"ok {counts.get('ok', 0)} failed {counts.get('failed', 0)} in flight {counts.get('in_flight', 0)}"
            self.progress.update(self.task, completed=done, detail=detail)

    def point_live(self, snapshot: LiveSnapshot) -> None:
        if self.live and self.point is not None:
            self.progress.panel = live_panel(self.point, snapshot)

    def point_end(self, point: str, entry: PointEntry) -> None:
        self.progress.panel = None  # the panel is of the running level only
        if self.task is not None:
            flags = ",".join(entry.flags)
            self.progress.update(self.task, detail=f"{entry.status}" + (f" [{flags}]" if flags else ""))
        self.task = None
        self.point = None

    def callbacks(self) -> Callbacks:
        return Callbacks(
            status=self.status,
            point_start=self.point_start,
            point_update=self.point_update,
            point_end=self.point_end,
            live=self.live,
            point_live=self.point_live,
        )
