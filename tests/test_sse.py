from gateway.sse import DONE, SSEEvent, SSEReader


def test_lines_make_events_named_by_the_line_before() -> None:
    reader = SSEReader()
    lines = [b"event: message_start\n", b'data: {"a":1}\r\n', b"\n", b": keep-alive\n"]
    events = [reader.line(raw) for raw in lines]
    assert events == [None, SSEEvent("message_start", b'{"a":1}'), None, None]
    assert reader.line(b"data: [DONE]\n") == SSEEvent(None, DONE)  # the name was used up


def test_chunks_split_anywhere_give_the_same_events() -> None:
    stream = b'event: ping\ndata: {"type":"ping"}\n\ndata: {"x": 2}\n\ndata: [DONE]\n\n'
    whole = SSEReader().feed(stream)
    assert whole == [
        SSEEvent("ping", b'{"type":"ping"}'),
        SSEEvent(None, b'{"x": 2}'),
        SSEEvent(None, DONE),
    ]
    for cut in range(1, len(stream)):
        reader = SSEReader()
        assert reader.feed(stream[:cut]) + reader.feed(stream[cut:]) == whole
