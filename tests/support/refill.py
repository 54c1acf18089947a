"""What a token bucket may have refilled while a test ran.

A gateway process refills its buckets on its own monotonic clock, and Redis on its own
(`TIME`): no test can stop either. So a test that counts admissions allows exactly the
refill that the time it took could have brought: the bound is exact on a fast machine
and still true on a slow one.
"""

from __future__ import annotations

import math
import time


def refilled(since: float, per_minute: int) -> int:
    """Whole units a bucket of `per_minute` may have regained since `since` (monotonic)."""
    return math.ceil((time.monotonic() - since) * per_minute / 60)
