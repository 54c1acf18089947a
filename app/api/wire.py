"""Re-export: the wire format lives with the pipeline (`app.proxy.wire`), which the batch
runner shares with the HTTP routes."""

from app.proxy.wire import parse_call, parse_json

__all__ = ["parse_call", "parse_json"]
