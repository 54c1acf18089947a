"""A real OTLP/HTTP trace receiver on loopback: what a collector would get.

Serves `POST /v1/traces` (protobuf `ExportTraceServiceRequest`, gzip or not), decodes
each export with `opentelemetry-proto` and keeps every span with its resource, plus the
headers each export came with. Runs in a thread; `spans()` waits for what a test needs.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: Any) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Span:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, object]
    status_code: int
    resource: dict[str, object]
    start_ns: int
    end_ns: int


@dataclass
class Receiver:
    port: int = 0
    received: list[Span] = field(default_factory=list)
    export_headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def add(self, body: bytes, headers: dict[str, str]) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            self.export_headers.append(headers)
            for rs in request.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.received.append(
                            Span(
                                name=s.name,
                                kind=s.kind,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_id=s.parent_span_id.hex(),
                                attributes={a.key: _value(a.value) for a in s.attributes},
                                status_code=s.status.code,
                                resource=resource,
                                start_ns=s.start_time_unix_nano,
                                end_ns=s.end_time_unix_nano,
                            )
                        )

    def spans(self, ready: Callable[[list[Span]], bool], timeout: float = 20) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                now = list(self.received)
            if ready(now):
                return now
            time.sleep(0.05)
        raise TimeoutError(f"the spans never arrived; got {[s.name for s in now]}")


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.add(body, {k.lower(): v for k, v in self.headers.items()})
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
