"""The P3 load generator sends what a real sender would: a body equal to `json.dumps` of
the event, correctly v3-signed over exactly those bytes (its shortcuts are CPU only)."""

from __future__ import annotations

import json

from bench.webhook_load import PATH, PUBLIC_BASE, SECRET, Sender
from ingress.signature import sign_v3


def test_generated_requests_are_signed_json_deliveries() -> None:
    sender = Sender()
    seen = set()
    for _ in range(3):
        head, body = sender.request().split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        assert lines[0] == f"POST {PATH} HTTP/1.1"
        headers = dict(line.split(": ", 1) for line in lines[1:])
        assert int(headers["content-length"]) == len(body)
        timestamp = int(headers["x-hubspot-request-timestamp"])
        expected = sign_v3(SECRET, "POST", PUBLIC_BASE + PATH, body, timestamp)
        assert headers["x-hubspot-signature-v3"] == expected
        events = json.loads(body)
        assert json.dumps(events).encode() == body
        seen.add(events[0]["eventId"])
    assert len(seen) == 3  # a fresh business identity per request
