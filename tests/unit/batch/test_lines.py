from __future__ import annotations

import json

import pytest

from app.batch.service import _parse_line, request_counts

URL = "/v1/chat/completions"


def line(**obj: object) -> bytes:
    base = {"custom_id": "a", "method": "POST", "url": URL, "body": {"model": "m"}}
    return json.dumps({**base, **obj}).encode()


def test_a_good_line_becomes_a_pending_request() -> None:
    assert _parse_line(line(), URL) == ("a", {"model": "m"}, None)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{nope", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (line(custom_id=""), "missing_custom_id"),
        (line(method="GET"), "invalid_method"),
        (line(url="/v1/embeddings"), "invalid_url"),
        (line(body="text"), "invalid_body"),
        (line(body={"model": "m", "stream": True}), "stream_not_supported"),
    ],
)
def test_bad_lines_are_named(raw: bytes, code: str) -> None:
    _, _, problem = _parse_line(raw, URL)
    assert problem is not None and problem[0] == code


def test_request_counts_as_openai_reports_them() -> None:
    assert request_counts({"done": 3, "failed": 1, "pending": 2}) == {
        "total": 6,
        "completed": 3,
        "failed": 1,
    }
