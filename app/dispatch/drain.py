"""How long a domain's queue takes to drain: the Retry-After of its 503s.

A queue only forms while every dispatch slot is busy (or the pacer holds requests
back), so it drains at `slots / hold` requests per second, where `hold` is how long
a slot stays taken (the upstream's answer time, a stream's whole length), and never
faster than the pacer lets requests go. `hold` is measured: an exponentially weighted
mean of the slots released, so it follows the upstream within a few answers.

A queue of `ahead` requests then drains in `cooling + ahead * hold / slots` seconds
(or `ahead / pace` when the pacer is the narrower bound). Until the first slot comes
back there is no measure; a one-second hold is assumed, and replaced by the first one.

The estimate counted releases per second over a few seconds before: a burst into an
idle domain saw no release yet and advertised one second whatever the queue's length,
and after a quiet spell the rate of a long, empty window made it a minute.
"""

from __future__ import annotations

PRIOR_HOLD_SEC = 1.0  # assumed until the first slot is released
WEIGHT = 0.2  # of the newest hold in the mean: about the last ten answers count
FLOOR_SEC, CEILING_SEC = 0.05, 60.0  # SDKs ignore a Retry-After past 60 s


class DrainEstimate:
    """Pure: the dispatcher reports each slot's hold time; no clock needed."""

    def __init__(self, prior_hold: float = PRIOR_HOLD_SEC, weight: float = WEIGHT) -> None:
        self.hold = prior_hold
        self.measured = False
        self.weight = weight

    def released(self, held: float) -> None:
        """A slot was held `held` seconds (sent upstream to answer ended)."""
        held = max(0.0, held)
        if not self.measured:
            self.hold, self.measured = held, True
        else:
            self.hold += self.weight * (held - self.hold)

    def seconds(
        self, ahead: int, slots: int, pace: float | None = None, cooling: float = 0.0
    ) -> float:
        """Seconds until `ahead` queued requests have all been sent upstream."""
        wait = ahead * self.hold / max(1, slots)
        if pace is not None and pace > 0:
            wait = max(wait, ahead / pace)
        return min(CEILING_SEC, max(FLOOR_SEC, max(0.0, cooling) + wait))
