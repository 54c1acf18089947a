"""`tokengate keys new`: mint a gateway key; only its digest goes into settings."""

from __future__ import annotations

import json

from app.auth import digest, new_key


def new(alias: str) -> str:
    key = new_key()
    line = json.dumps({"alias": alias, "key_sha256": digest(key)})
    return "\n".join(
        [
            f"New gateway key for '{alias}' (shown once; store it in the client's secret store):",
            "",
            f"  {key}",
            "",
            "Add this entry to the `keys` list in settings.json:",
            "",
            f"  {line}",
            "",
            "Rotation: to replace an existing key without downtime, turn its `key_sha256` into a",
            "list holding the old and the new digest, reload (SIGHUP or restart), move clients to",
            "the new key, then remove the old digest and reload again.",
        ]
    )
