"""The SSE pieces without a server: Last-Event-ID parsing and the clients' SSE parser."""

from __future__ import annotations

import pytest

from app.api.event_stream import EventStreams, parse_last_event_id
from app.client._sse import Parser, follow_headers, reconnect_wait
from app.core.errors import BadRequest, TooManyRequests


@pytest.mark.parametrize("value", ["0", "41", " 7 ", "9223372036854775807"])
def test_event_ids_within_bigint_are_accepted(value: str) -> None:
    assert parse_last_event_id(value) == int(value)


@pytest.mark.parametrize(
    "value",
    ["", "abc", "-1", "+1", "1.5", "1e3", "9223372036854775808", "9" * 40, "١٢", "1\x002", "½"],
)
def test_anything_else_is_a_bad_request(value: str) -> None:
    with pytest.raises(BadRequest, match="Last-Event-ID"):
        parse_last_event_id(value)


def test_the_tenant_bound_counts_open_streams_per_tenant() -> None:
    streams = EventStreams(limit=2)
    streams.acquire("a")
    streams.acquire("a")
    streams.acquire("b")
    with pytest.raises(TooManyRequests) as refused:
        streams.acquire("a")
    assert refused.value.data["retry_after_seconds"] > 0
    streams.release("a")
    streams.acquire("a")
    assert streams.open_count("a") == 2 and streams.open_count("b") == 1


def test_the_client_parser_joins_fields_and_skips_comments() -> None:
    parser = Parser()
    lines = [": heartbeat", "", "event: emitted", 'data: {"a":', "data: 1}", "id: 9", ""]
    found = [m for m in (parser.feed(line) for line in lines) if m is not None]
    assert [(m.event, m.data, m.id) for m in found] == [("emitted", '{"a":\n1}', "9")]
    assert parser.feed("retry: 1000") is None and parser.feed("") is None
    assert follow_headers(None) == {"Accept": "text/event-stream"}
    assert follow_headers(5)["Last-Event-ID"] == "5"
    assert [reconnect_wait(n) for n in (1, 2, 3, 10)] == [0.25, 0.5, 1.0, 5.0]
