"""Client-given request ids (SGLang's ``rid_to_state``): duplicates refused, and the background abort a streamed
response leaves behind."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rig.sim.engine import Engine, Stream
from rig.sim.sampling import BadRequest

log = logging.getLogger("rig.sim")
# entrypoints/http_server.py and openai/serving_*.py attach TokenizerManager.create_abort_task to every streamed
# response: it sleeps 2 s after the stream ends, then aborts the rid if a request under it is live
# (srt/managers/tokenizer_manager.py, 0.5.17 lines 2134-2146, 0.5.23 lines 2427-2437).
ABORT_AFTER_STREAM_S = 2.0


class DuplicateRid(BadRequest):
    """managers/tokenizer_manager.py (_validate_and_register_rids, ~line 3833): a rid already in rid_to_state (a
    request not yet finished) is a ValueError, which each route answers in its own shape."""

    def __init__(self, rid: str) -> None:
        super().__init__(f"Duplicate request ID detected: {rid}")


class Rids:
    """The rids of unfinished requests that the client named."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._live: dict[str, Stream] = {}

    def check(self, rid: str | None) -> None:
        """Refuse a rid that an unfinished request holds."""
        if rid is not None:
            known = self._live.get(rid)
            if known is not None and not known.finished:
                raise DuplicateRid(rid)

    def register(self, rid: str | None, st: Stream) -> None:
        if rid is not None:
            self._live[rid] = st

    def release(self, st: Stream, streamed: bool) -> None:
        """The request left rid_to_state (finished or aborted): its rid may be used again, and, after a streamed
        response, SGLang's background abort fires under it 2 s later."""
        if self._live.get(st.rid) is st:
            del self._live[st.rid]
            if streamed:
                self._later(ABORT_AFTER_STREAM_S, self.abort, st.rid)

    def refused_stream(self, rid: str | None) -> None:
        """A streamed /generate refused inside its stream (a duplicate rid, a prompt too long) still carries the
        background abort: 2 s after it ends, a request live under that rid is aborted, which for a duplicate is
        the original (recorded on SGLang 0.5.17: tests/data/sglang-0.5.17-recorded, busy_long_stream ended abort
        2.0 s after err_duplicate_live_rid was refused)."""
        if rid is not None:
            self._later(ABORT_AFTER_STREAM_S, self.abort, rid)

    @staticmethod
    def _later(delay: float, fn: Callable[[str], int], rid: str) -> None:
        asyncio.get_running_loop().call_later(delay, fn, rid)

    def abort(self, rid: str) -> int:
        """TokenizerManager.abort_request: nothing unless ``rid`` itself is live (an exact look-up in rid_to_state);
        then the scheduler aborts every request whose rid *starts with* it (``req.rid.startswith(recv_req.rid)``,
        srt/managers/scheduler.py ``abort_request``), each ending with finish_reason abort, "Aborted" (as SGLang
        0.5.17 answered on the H200). Returns how many it aborted."""
        if rid not in self._live:
            return 0
        hit = [st for r, st in self._live.items() if r.startswith(rid) and not st.finished]
        for st in hit:
            log.info("Abort request rid=%s (a stream under rid %s ended %.0f s ago)", st.rid, rid, ABORT_AFTER_STREAM_S)
            self.engine.abort(st, message="Aborted")
        return len(hit)
