"""The id a request goes out under, where the body names it (SGLang's ``rid``).

The record's ``request_id`` is the pairing key, the same at every point of a run; on the wire it carries a tag of
the attempt. SGLang aborts a live rid 2 s after an earlier stream under the same rid ended
(``TokenizerManager.create_abort_task``, srt/managers/tokenizer_manager.py), and its scheduler aborts by rid
*prefix* (``req.rid.startswith``, srt/managers/scheduler.py): on SGLang 0.5.17 every point after the first of a
sweep lost its requests to that. A tag of fixed length after ``@`` keeps the ids unique per attempt and none a
prefix of another (``s-t1@tag`` vs ``s-t10@tag``).
"""

from __future__ import annotations

import uuid

TAG_HEX = 12


def new_rid_tag() -> str:
    """A tag unique to one generator's attempt at one point."""
    return uuid.uuid4().hex[:TAG_HEX]


def wire_id(request_id: str, tag: str) -> str:
    return f"{request_id}@{tag}" if tag else request_id
