"""Gateway keys: only SHA-256 digests are configured, never the keys themselves.

Lookup is by digest, then confirmed with `hmac.compare_digest`. The dict lookup's
timing depends only on the digest of what the client sent, which tells an attacker
nothing about any stored key (finding a key from its digest is a preimage attack), so
the check is constant-time with respect to the secrets.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime

from app.errors import AuthenticationFailed, KeyExpired
from app.runtime import KeySpec

KEY_PREFIX = "tg-"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyIndex:
    def __init__(self, keys: tuple[KeySpec, ...], *, enabled: bool, anonymous: KeySpec) -> None:
        self.enabled = enabled
        self.anonymous = anonymous
        self._by_digest = {d: k for k in keys for d in k.digests}
        self.by_alias = {k.alias: k for k in keys}

    def authenticate(self, authorization: str | None, api_key: str | None = None) -> KeySpec:
        if not self.enabled:
            return self.anonymous
        presented = _bearer(authorization) or (api_key or "").strip()
        if not presented:
            raise AuthenticationFailed(
                "Missing API key: send `Authorization: Bearer <gateway key>`.",
                code="missing_api_key",
            )
        wanted = digest(presented)
        spec = self._by_digest.get(wanted)
        if spec is None or not any(hmac.compare_digest(wanted, d) for d in spec.digests):
            raise AuthenticationFailed("Incorrect API key provided.")
        if spec.expires_at is not None and datetime.now(UTC) >= spec.expires_at:
            raise KeyExpired(
                f"This key expired at {spec.expires_at.isoformat()}; ask for a new one.",
                alias=spec.alias,
            )
        return spec


def bearer_matches(header: str | None, secret: str) -> bool:
    """`Authorization: Bearer <secret>`, compared in constant time. Nothing after
    `Bearer` never matches, whatever `secret` is (config refuses a blank one anyway)."""
    presented = _bearer(header)
    return bool(presented and secret) and hmac.compare_digest(
        presented.encode("utf-8"), secret.encode("utf-8")
    )


def _bearer(header: str | None) -> str:
    if not header:
        return ""
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""
