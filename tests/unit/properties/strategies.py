"""Hypothesis strategies for OpenAI-shaped request bodies (shared with the e2e fuzzing)."""

from __future__ import annotations

from hypothesis import strategies as st

JSON_INT = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what orjson reads

leaves = st.one_of(
    st.none(),
    st.booleans(),
    JSON_INT,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "tool"])},
            optional={
                "content": st.one_of(
                    st.text(max_size=30),
                    st.lists(
                        st.one_of(
                            st.fixed_dictionaries({"type": st.just("text"), "text": leaves}),
                            json_values,
                        ),
                        max_size=3,
                    ),
                    json_values,
                ),
                "tool_calls": json_values,
            },
        ),
        json_values,
    ),
    max_size=4,
)
FIELD_VALUES = {
    "model": st.one_of(st.sampled_from(["gpt-4o", "claude-sonnet", "", " "]), json_values),
    "messages": st.one_of(messages, json_values),
    "prompt": st.one_of(st.text(max_size=30), st.lists(JSON_INT, max_size=5), json_values),
    "input": st.one_of(st.text(max_size=30), st.lists(st.text(max_size=8)), json_values),
    "stream": st.one_of(st.booleans(), json_values),
    "stream_options": st.one_of(
        st.fixed_dictionaries({"include_usage": st.one_of(st.booleans(), json_values)}),
        json_values,
    ),
    "max_tokens": st.one_of(JSON_INT, st.integers(-2, 5), json_values),
    "max_completion_tokens": st.one_of(JSON_INT, json_values),
    "n": st.one_of(st.integers(-1, 200), json_values),
    "tools": json_values,
    "system": json_values,
    "temperature": json_values,
}
request_like = st.fixed_dictionaries(
    {}, optional={name: strategy for name, strategy in FIELD_VALUES.items()}
)
