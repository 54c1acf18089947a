"""The simulator's prompt cache: prefixes at segment boundaries, OpenAI's automatic rule
and Anthropic's breakpoints, markers and string contents normalised, LRU bound."""

from __future__ import annotations

from app.sim.cache import CacheUse, PromptCache, Rule, Segment, normalise


def turn(*texts: str, tokens: int = 600) -> list[Segment]:
    return [Segment({"role": "user", "content": t}, tokens) for t in texts]


def test_automatic_rule_reads_the_longest_prefix_seen_before() -> None:
    cache = PromptCache(min_tokens=1000)
    assert cache.use(turn("sys", "q1"), Rule.AUTOMATIC) == CacheUse(0, 0)
    # the next turn repeats both messages, then adds two: 1200 of its 2400 tokens hit
    assert cache.use(turn("sys", "q1", "a1", "q2"), Rule.AUTOMATIC).read == 1200
    assert cache.use(turn("sys", "q1", "a1", "q2", "a2"), Rule.AUTOMATIC).read == 2400
    assert cache.use(turn("other", "q1"), Rule.AUTOMATIC).read == 0  # a different start


def test_prefixes_shorter_than_the_minimum_are_neither_read_nor_stored() -> None:
    cache = PromptCache(min_tokens=1024)
    cache.use(turn("sys", tokens=1000), Rule.AUTOMATIC)
    assert len(cache) == 0
    assert cache.use(turn("sys", "q", tokens=1000), Rule.AUTOMATIC).read == 0


def test_breakpoints_store_up_to_the_last_marker_and_report_what_they_wrote() -> None:
    cache = PromptCache(min_tokens=0)
    marked = {"role": "user", "content": [{"type": "text", "text": "q1", "cache_control": {}}]}
    first = [Segment("system", 500, True), Segment(marked, 300, True), Segment("tail", 200)]
    assert cache.use(first, Rule.BREAKPOINTS) == CacheUse(read=0, written=800)
    # the marker moved and the content became a plain string: the same tokens, a hit
    second = [Segment("system", 500), Segment({"role": "user", "content": "q1"}, 300)]
    second += [Segment("tail", 200, True)]
    assert cache.use(second, Rule.BREAKPOINTS) == CacheUse(read=800, written=200)


def test_without_a_breakpoint_anthropic_caches_nothing() -> None:
    cache = PromptCache(min_tokens=0)
    plain = [Segment("system", 500), Segment("q", 300)]
    assert cache.use(plain, Rule.BREAKPOINTS) == CacheUse()
    assert cache.use(plain, Rule.BREAKPOINTS) == CacheUse()


def test_the_cache_forgets_the_least_recently_used_prefix() -> None:
    cache = PromptCache(entries=2, min_tokens=0)
    cache.use(turn("a"), Rule.AUTOMATIC)
    cache.use(turn("b"), Rule.AUTOMATIC)
    assert cache.use(turn("a"), Rule.AUTOMATIC).read == 600  # refreshed: "b" is oldest now
    cache.use(turn("c"), Rule.AUTOMATIC)
    assert cache.use(turn("b"), Rule.AUTOMATIC).read == 0
    assert len(cache) == 2


def test_deep_nesting_is_answered_not_crashed_on() -> None:
    deep: object = "x"
    for _ in range(600):  # deeper than orjson writes (254), within what it reads (1024)
        deep = [deep]
    value = {"content": deep, "cache_control": {"type": "ephemeral"}}
    assert normalise(value) == {"content": deep}
    cache = PromptCache(min_tokens=0)
    assert cache.use([Segment(value, 5, True)], Rule.BREAKPOINTS) == CacheUse()
