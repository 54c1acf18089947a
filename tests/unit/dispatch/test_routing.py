from __future__ import annotations

from dataclasses import dataclass

from app.dispatch.routing import rank, serving


@dataclass
class D:
    name: str
    models: frozenset[str] | None
    up: bool = True
    wait: float = 1.0

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models

    def available(self) -> bool:
        return self.up

    def expected_wait(self) -> float:
        return self.wait


def test_model_reaches_only_the_domains_serving_it() -> None:
    a, b, c = D("a", frozenset({"m1"})), D("b", frozenset({"m2"})), D("c", None)
    assert serving([a, b, c], "m1", None) == [a, c]
    assert serving([a, b, c], "m2", None) == [b, c]


def test_a_pinned_key_sees_only_its_domain() -> None:
    a, b = D("a", frozenset({"m"})), D("b", frozenset({"m"}))
    assert serving([a, b], "m", "b") == [b]
    assert serving([a, b], "other", "b") == []


def test_rank_prefers_available_then_lowest_expected_wait() -> None:
    slow, fast, down = D("slow", None, wait=5), D("fast", None, wait=1), D("down", None, up=False)
    assert rank([slow, down, fast]) == [fast, slow]
    assert rank([down]) == []
