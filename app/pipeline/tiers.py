"""Service tiers (`service_tier`): where a request that asks for one waits, what goes
upstream, and the 429 a flex request gets when there is no spare capacity.

    the domain serves the tier itself   the request goes as it is (the key's forced tier
    (`[[scale_up]] service_tiers`)      written in), in the key's own queue class
    it does not                         `service_tier` is taken out and the gateway serves
                                        the tier with its own classes:
        priority                        the `high` class
        flex                            the `batch` class: only capacity interactive
                                        traffic leaves (`batch.share` of the slots), and
                                        up to `flex_max_queue_wait_ms` in the queue
        auto, default                   the key's own class

A flex request the gateway could not place (its queue full, or the wait over) gets the
429 OpenAI documents for flex, `resource_unavailable`, and is charged nothing; so does one
a flex-serving upstream answered with 429 (its flex capacity is short: unlike a rate
limit, that does not cool the domain down for everyone else). What a
request costs is decided later, by the tier the upstream says served it (the answer's
`service_tier`, `app.billing.prices`).
"""

from __future__ import annotations

from app.errors import FlexUnavailable, GatewayError, ServiceUnavailable
from app.kinds import QueueClass, ServiceTier
from app.pipeline.request import ClientRequest
from app.runtime import DomainSpec
from app.upstream.attempt import AttemptFailed

_NO_CAPACITY = frozenset({"queue_full", "queue_timeout"})


class ServiceTiers:
    def __init__(self) -> None:
        self.flex_extra_wait = 0.0

    def configure(self, max_queue_wait_ms: int, flex_max_queue_wait_ms: int) -> None:
        self.flex_extra_wait = max(0, flex_max_queue_wait_ms - max_queue_wait_ms) / 1000

    def place(self, call: ClientRequest, spec: DomainSpec) -> tuple[QueueClass, bool, float]:
        """(queue class, whether `service_tier` goes upstream, seconds of queue wait on top
        of `max_queue_wait_ms`) for a request with a tier, on this domain."""
        tier = call.service_tier
        if tier is None or tier in spec.service_tiers:
            return call.queue_class, True, 0.0
        if tier is ServiceTier.FLEX:
            return QueueClass.BATCH, False, self.flex_extra_wait
        if tier is ServiceTier.PRIORITY:
            return QueueClass.HIGH, False, 0.0
        return call.queue_class, False, 0.0

    @staticmethod
    def upstream_refused(call: ClientRequest, failure: AttemptFailed) -> FlexUnavailable | None:
        """A 429 to a flex request the upstream served as flex: its flex capacity is short,
        which says nothing of the key's quota, so the domain is not cooled down (as for a
        rate limit) and the client gets flex's 429 at once, as from the provider."""
        if call.service_tier is not ServiceTier.FLEX:
            return None
        return FlexUnavailable(
            "Resource Unavailable: the upstream has no flex capacity for this request right "
            "now; retry later, or send it with another service_tier.",
            param="service_tier",
            retry_after=failure.retry_after,
            should_retry=True,
        )

    @staticmethod
    def refusal(call: ClientRequest, error: GatewayError) -> GatewayError:
        """The error a request gets when no domain served it: a flex request that found
        no capacity gets flex's own 429 instead of the queue's 503."""
        if (
            call.service_tier is ServiceTier.FLEX
            and isinstance(error, ServiceUnavailable)
            and error.code in _NO_CAPACITY
        ):
            return FlexUnavailable(
                "Resource Unavailable: no spare capacity for this service_tier 'flex' request "
                "right now; retry later, or send it with another service_tier. You are not "
                "charged for it.",
                param="service_tier",
                retry_after=error.retry_after,
                should_retry=True,
            )
        return error
