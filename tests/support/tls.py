"""A private certificate authority for loopback TLS servers, made by the `openssl` CLI.

A CA (its own key, `CA:TRUE`) signs one certificate for localhost, 127.0.0.1 and ::1
(good for a server and, for mutual TLS such as Redis' `tls-auth-clients`, for a
client), as an operator's internal PKI would (no test dependency: `trustme` is not on
this project's package index). The server context presents the leaf; the client trusts
only the CA (`client()`, or `SSL_CERT_FILE=ca` for a process that reads the system
store), so a test also proves the client verifies the chain and the name.
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
    ca: Path  # the CA's certificate: what a client must trust
    cert: Path  # the server's certificate, signed by the CA
    key: Path

    def server(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@cache
def certificate() -> Certificate:
    """Made once per test process, in a directory that lives as long as it."""
    folder = Path(tempfile.mkdtemp(prefix="tokengate-tls-"))
    ca, ca_key = folder / "ca.pem", folder / "ca-key.pem"
    cert, key, csr = folder / "cert.pem", folder / "key.pem", folder / "cert.csr"
    ext = folder / "leaf.ext"
    ext.write_text(
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        "extendedKeyUsage = serverAuth, clientAuth\n"
        "subjectAltName = DNS:localhost, IP:127.0.0.1, IP:::1\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-days", "2", "-subj", "/CN=tokengate test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(ca_key), "-out", str(ca),
    )  # fmt: skip
    _openssl("req", "-new", *ec, "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(csr))
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    return Certificate(ca, cert, key)
