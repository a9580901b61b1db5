"""Incremental Server-Sent Events parser: bytes in (split anywhere), complete event payloads out."""

from __future__ import annotations


class SSEParser:
    """Feeds arbitrary byte chunks; returns the ``data`` payload of every event completed so far.

    Events end at a blank line. Several ``data:`` lines in one event are joined with newlines (per the SSE spec);
    comment lines (``:``) and other fields (``event:``, ``id:``, ``retry:``) are ignored. CRLF and LF both work.
    Bytes that are not UTF-8 are replaced rather than raising, so a corrupt stream becomes a parse error upstream
    (bad JSON) instead of a crash here.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        events: list[str] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            raw, self._buf = self._buf[:nl], self._buf[nl + 1 :]
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            text = line.decode("utf-8", errors="replace")
            if text.startswith(":"):
                continue
            field, _, value = text.partition(":")
            if field == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)
        return events

    def close(self) -> tuple[list[str], bool]:
        """End of stream: returns (events completed by the final bytes, whether a partial event was cut off).

        A final event without its blank line is still delivered (many servers omit it after ``[DONE]``); anything
        left that is not a complete ``data:`` line counts as a truncated event.
        """
        events: list[str] = []
        truncated = False
        if self._buf:
            rest = self._buf.decode("utf-8", errors="replace").rstrip("\r")
            self._buf = b""
            if rest.startswith("data:"):
                # A data line with no newline at all: we cannot know it is complete unless it parses later.
                truncated = True
                self._data.append(rest[5:].lstrip(" "))
            elif rest and not rest.startswith(":"):
                truncated = True
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events, truncated
