"""Incremental Server-Sent Events parser: bytes in (split anywhere), complete event payloads out."""

from __future__ import annotations


class SSEBytesParser:
    """Feeds arbitrary byte chunks; returns the ``data`` payload (bytes) of every event completed so far.

    Events end at a blank line. Several ``data:`` lines in one event are joined with newlines (per the SSE spec);
    comment lines (``:``) and other fields (``event:``, ``id:``, ``retry:``) are ignored. CRLF and LF both work.
    Works on bytes end to end (no decode per line): the payloads go straight to a JSON parser that reads bytes.
    """

    __slots__ = ("_buf", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        array, count, rest = self.feed_objects(chunk)
        if not count:
            return rest
        return array_events(array) + rest

    def feed_objects(self, chunk: bytes) -> tuple[bytes, int, list[bytes]]:
        """Like ``feed``, for a JSON parser: (array, count, rest). When the read's complete events start with
        ``count`` > 0 single-line ``data: {...}`` events, ``array`` is their payloads as one JSON array text
        (``[e1,\ne2,...]``: one parse for all of them) and ``rest`` the events after them (``[DONE]``); otherwise
        ``array`` is empty, ``count`` 0 and ``rest`` every event."""
        buf = self._buf + chunk if self._buf else chunk
        if not self._data and b"\r" not in buf:
            # The common shape, one "data: ..." line per event, LF only: split the read at blank lines at once.
            cut = buf.rfind(b"\n\n") + 2
            if cut > 1:
                head = buf[:cut] if cut < len(buf) else buf
                done = head.endswith(b"data: [DONE]\n\n") and (len(head) == 14 or head[-16:-14] == b"\n\n")
                if done:  # the stream's last event, after the usage one: an event of its own (a blank line before)
                    head = head[:-14]
                # n "data: {...}" lines, each followed by a blank line: n - 1 "}\n\ndata: {" between them and no
                # other newline (two passes over the read, both in C)
                n = head.count(b"}\n\ndata: {") + 1
                array, events = b"", []
                if head.startswith(b"data: {") and head.endswith(b"}\n\n") and head.count(b"\n") == 2 * n:
                    # no raw newline can be inside a payload (JSON strings hold none), so ",\n" joins them into one
                    # array (and splits them back)
                    array = b"[" + head[6:-2].replace(b"\n\ndata: ", b",\n") + b"]"
                else:
                    n = head.count(b"\n\n")
                    # every block is exactly one "data: " line: n blank-line ends, 2n newlines, n "data: " starts
                    if (
                        head.count(b"\n") == 2 * n
                        and (not n or head.startswith(b"data: "))
                        and head.count(b"\n\ndata: ") == n - 1
                    ):
                        events = [b[6:] for b in head.split(b"\n\n")[:-1]]
                    else:
                        events = self._slow(head)  # ends at a blank line: no event left open
                    n = 0
                if done:
                    events.append(b"[DONE]")
                self._buf = b""
                if cut < len(buf):
                    events += self._slow(buf[cut:])
                return array, n, events
        return b"", 0, self._slow(buf)

    def _slow(self, buf: bytes) -> list[bytes]:
        """Line by line: comments, other fields, multi-line data, CRLF."""
        events: list[bytes] = []
        data = self._data
        pos = 0
        find = buf.find
        while True:
            nl = find(b"\n", pos)
            if nl < 0:
                break
            line = buf[pos:nl]
            pos = nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = self._data = []
                continue
            if line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
            elif line == b"data":
                data.append(b"")
            # comments (":...") and other fields are ignored
        self._buf = buf[pos:] if pos < len(buf) else b""
        return events

    def close(self) -> tuple[list[bytes], bool]:
        """End of stream: returns (events completed by the final bytes, whether a partial event was cut off).

        A final event without its blank line is still delivered (many servers omit it after ``[DONE]``); anything
        left that is not a complete ``data:`` line counts as a truncated event.
        """
        events: list[bytes] = []
        truncated = False
        if self._buf:
            rest = self._buf.rstrip(b"\r")
            self._buf = b""
            if rest.startswith(b"data:"):
                # A data line with no newline at all: we cannot know it is complete unless it parses later.
                truncated = True
                self._data.append(rest[5:].lstrip(b" "))
            elif rest and not rest.startswith(b":"):
                truncated = True
        if self._data:
            events.append(b"\n".join(self._data))
            self._data = []
        return events, truncated


class SSEParser:
    """The same parser with ``str`` payloads; bytes that are not UTF-8 are replaced rather than raising, so a
    corrupt stream becomes a parse error upstream (bad JSON) instead of a crash here."""

    def __init__(self) -> None:
        self._p = SSEBytesParser()

    def feed(self, chunk: bytes) -> list[str]:
        return [e.decode("utf-8", errors="replace") for e in self._p.feed(chunk)]

    def close(self) -> tuple[list[str], bool]:
        events, cut = self._p.close()
        return [e.decode("utf-8", errors="replace") for e in events], cut


def array_events(array: bytes) -> list[bytes]:
    """The event payloads joined by ``SSEBytesParser.feed_objects`` into one array text, split back (its inverse)."""
    return array[1:-1].split(b",\n")
