from __future__ import annotations

from app.limits.estimate import TextCounter, chat_prompt_tokens, input_tokens, text_tokens


def test_ascii_is_a_quarter_token_per_char_rounded_up() -> None:
    assert text_tokens("") == 0
    assert text_tokens("abcd") == 1
    assert text_tokens("abcde") == 2


def test_cjk_counts_one_token_per_character() -> None:
    assert text_tokens("你好世界") == 4
    assert text_tokens("こんにちは") == 5
    assert text_tokens("hi 你好") == 2 + 1  # 2 CJK + "hi " (3 chars -> 1)


def test_chat_adds_message_framing() -> None:
    msgs = [{"role": "system", "content": "abcd"}, {"role": "user", "content": "abcd"}]
    assert chat_prompt_tokens(msgs) == 3 + 2 * (4 + 1)


def test_content_parts_and_token_id_inputs() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}]
    assert chat_prompt_tokens(msgs) == 3 + 4 + 2
    assert input_tokens([1, 2, 3]) == 3
    assert input_tokens(["abcd", "efgh"]) == 2


def test_text_counter_does_not_accumulate_rounding() -> None:
    c = TextCounter()
    for _ in range(8):
        c.add("a")
    assert c.tokens == 2  # 8 chars, not 8 x ceil(1/4)
