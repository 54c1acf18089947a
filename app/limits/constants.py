"""The numbers the Python pacer and bucket share with their Lua twins.

`pacing.py` and `bucket.py` import them; the scripts' declarations (`shared_store.py`,
`app/state/scripts.py`) write them as `local` lines at the top of `pace.lua` and
`token_bucket.lua` when the scripts are loaded, so the two
implementations can not drift apart by a typo (the parity tests then check the
arithmetic itself).
"""

from __future__ import annotations

# -- the pacer (pacing.py, pace.lua) ------------------------------------------------------
HEADROOM = 0.98  # pace a little under a quota: gateway-to-upstream jitter shifts arrivals
BETA = 0.7  # multiplicative decrease on a new throttle episode, without a better measure
ACCEPTED_SHARE = 0.9  # ... with one: this share of the rate the upstream accepted
GROWTH = 0.03  # additive increase: this share of the decreased rate, per second
MIN_STEP = 0.2  # ... and at least this many requests/s per second
MIN_RATE = 0.2  # requests/s: the learned rate never drops below
FORGET = 2.0  # without a ceiling, a learned rate that doubled without a 429 is forgotten
BURST_SHARE = 0.05  # of a window's quota that may go at once
FIRST_BACKOFF = 1.0  # seconds: a header-less 429's first cool-down
MAX_BACKOFF = 16.0
MAX_COOL_DOWN = 60.0  # one 429's wait: a longer Retry-After is asked again after this
PACE_TTL_MS = 3_600_000  # a domain's shared pace is forgotten after a quiet hour

# -- the per-key buckets (bucket.py, token_bucket.lua) -------------------------------------
WINDOW_SEC = 60.0  # a bucket holds one minute's allowance
BUCKET_TTL_MS = 120_000  # after 2 windows idle a bucket is full again: Redis forgets it

PACE_LUA = (
    "HEADROOM",
    "BETA",
    "ACCEPTED_SHARE",
    "GROWTH",
    "MIN_STEP",
    "MIN_RATE",
    "FORGET",
    "BURST_SHARE",
    "FIRST_BACKOFF",
    "MAX_BACKOFF",
    "MAX_COOL_DOWN",
    "PACE_TTL_MS",
)
BUCKET_LUA = ("WINDOW_SEC", "BUCKET_TTL_MS")


def values(names: tuple[str, ...]) -> dict[str, float]:
    """The named constants and their values (what a script's `-- @constants` line gets)."""
    return {name: globals()[name] for name in names}
