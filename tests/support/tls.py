"""A throwaway certificate for loopback TLS servers, made by the `openssl` CLI.

One self-signed certificate for localhost, 127.0.0.1 and ::1 (no test dependency:
`trustme` is not on this project's package index). The server context presents it;
the client context trusts only it, so a test also proves the client verifies.
"""

from __future__ import annotations

import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path

    def server(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))


@cache
def certificate() -> Certificate:
    """Made once per test process, in a directory that lives as long as it."""
    folder = Path(tempfile.mkdtemp(prefix="tokengate-tls-"))
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return Certificate(cert, key)
