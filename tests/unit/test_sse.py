"""SSE parsing: events split across reads, several per read, comments, CRLF, and streams cut off."""

from rig.loadgen.sse import SSEParser


def feed_all(chunks: list[bytes]) -> tuple[list[str], bool]:
    p = SSEParser()
    events: list[str] = []
    for c in chunks:
        events += p.feed(c)
    tail, cut = p.close()
    return events + tail, cut


def test_event_split_across_reads_at_every_byte():
    raw = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    whole, _ = feed_all([raw])
    assert whole == ['{"a": 1}', '{"b": 2}', "[DONE]"]
    for cut in range(1, len(raw)):
        assert feed_all([raw[:cut], raw[cut:]]) == (whole, False)
    # one byte at a time
    assert feed_all([bytes([b]) for b in raw]) == (whole, False)


def test_crlf_comments_other_fields_and_multiline_data():
    raw = b": keep-alive\r\nevent: message\r\nid: 7\r\ndata: line1\r\ndata: line2\r\n\r\ndata:nospace\n\n"
    events, cut = feed_all([raw])
    assert events == ["line1\nline2", "nospace"]
    assert not cut


def test_final_event_without_blank_line_is_delivered():
    events, cut = feed_all([b'data: {"x": 1}\n'])
    assert events == ['{"x": 1}']
    assert not cut


def test_stream_cut_off_mid_event_is_reported():
    events, cut = feed_all([b'data: {"x": 1}\n\ndata: {"y": '])
    assert events[0] == '{"x": 1}'
    assert cut  # the partial event is flagged so the caller records a truncated stream
    assert events[1] == '{"y": '


def test_invalid_utf8_does_not_raise():
    events, _ = feed_all([b"data: \xff\xfe\n\n"])
    assert len(events) == 1 and "\ufffd" in events[0]
