"""Route checks: is every model the routes and aliases name listed by some domain?

`Gateway` runs `RouteCheck.check` after each health probe and reload; `/health/ready`
and the status page show `state`. A target no domain lists is counted in
`tokengate_route_unresolved{model}` and warned about once, when it first goes missing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from app.dispatch.domain import Domain
from app.metrics import Metrics
from app.runtime import Runtime

log = logging.getLogger("tokengate.gateway")


def route_targets(runtime: Runtime) -> set[str]:
    """The models the routes and aliases send requests to (after aliasing)."""
    s = runtime.settings
    aliases = s.model_aliases
    named = [s.model_route.default, *runtime.fallbacks]
    return {aliases.get(m, m) for m in named if m} | set(aliases.values())


def route_state(runtime: Runtime, domains: Sequence[Domain]) -> dict[str, list[str]]:
    """Route and alias targets no domain lists (`unverified`: a list is still unknown)."""
    known = [d.models() for d in domains]
    listed = set().union(*(m for m in known if m is not None))
    missing = sorted(route_targets(runtime) - listed)
    if any(m is None for m in known):
        return {"unresolved": [], "unverified": missing}
    return {"unresolved": missing, "unverified": []}


class RouteCheck:
    """Remembers which targets were already unresolved, so each is warned about once."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._unresolved: set[str] = set()

    def check(self, runtime: Runtime, domains: Sequence[Domain]) -> None:
        unresolved = set(route_state(runtime, domains)["unresolved"])
        for model in sorted(route_targets(runtime)):
            self.metrics.set_route_unresolved(model, model in unresolved)
        for model in sorted(unresolved - self._unresolved):
            log.warning(
                "model route target %r is listed by no domain's /v1/models: fix model_route / "
                "model_aliases in settings.json or that domain's `models`",
                model,
            )
        self._unresolved = unresolved
