"""The simulator's extended thinking: a signed block out, an intact one demanded back."""

from __future__ import annotations

from typing import Any

from app.sim.messages import THINKING, bad_signature, signature


def history(block: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [block, {"type": "text", "text": "ok"}]},
        {"role": "user", "content": "go on"},
    ]


def test_an_intact_block_passes_and_any_change_is_refused() -> None:
    good = {"type": "thinking", "thinking": THINKING, "signature": signature(THINKING)}
    assert bad_signature(history(good)) is None
    for altered in (
        {**good, "thinking": THINKING.replace("\u2028", "\n")},
        {**good, "signature": good["signature"][:-4] + "AAAA"},
        {"type": "thinking", "thinking": THINKING},
    ):
        assert "Invalid `signature`" in (bad_signature(history(altered)) or "")
    assert bad_signature([{"role": "user", "content": "plain"}]) is None
