"""Which model a request is served with, and which domains may serve it.

    asked model (or model_route.default)  ──► alias (exact, then pattern) ──► target
      └► the key may use it?                                                  403
          └► domains speaking the request's API (OpenAI, Anthropic, Responses)  404
              └► serving the target (listed or discovered), the key's pin,
                 the domain holding a `previous_response_id`                    404 / 400
    and, only if those fail: model_route.fallback, in order, under the same rules.

Pure over the domains' current state: the pipeline asks, and ranks and dispatches.
"""

from __future__ import annotations

from collections.abc import Iterator

from app.dispatch.domain import Domain
from app.dispatch.routing import serving
from app.errors import InvalidRequest, ModelNotFound, NotFound, PermissionDenied
from app.pipeline.aliases import Aliases
from app.pipeline.request import ClientRequest, Endpoint
from app.runtime import KeySpec, Runtime


class Planner:
    def __init__(self, domains: list[Domain]) -> None:
        self.domains = domains

    def configure(self, runtime: Runtime) -> None:
        """Take routes and aliases from `runtime` (at start and on reload)."""
        self.runtime = runtime
        self.aliases = Aliases(runtime.settings.model_aliases)
        # Domains by the API they speak (anthropic or not), looked up per request.
        self.speaking = {a: [d for d in self.domains if d.speaks(a)] for a in (False, True)}
        self.responders = [d for d in self.speaking[False] if d.spec.responses]

    def speakers(self, endpoint: Endpoint) -> list[Domain]:
        """The domains whose upstream speaks the API of `endpoint`."""
        return self.responders if endpoint.responses else self.speaking[endpoint.anthropic]

    def target(self, key: KeySpec, asked: str) -> str:
        """The model `asked` resolves to (aliases), if `key` may use it."""
        target = self.aliases.resolve(asked, self._listed)
        if not self._allowed(key.models, asked, target):
            raise PermissionDenied(
                f"the key '{key.alias}' is not allowed to use model '{asked}'", param="model"
            )
        return target

    def resolve(self, call: ClientRequest) -> tuple[str, str]:
        """(the model asked for, the model to serve): the default route, then `target`;
        400 without either."""
        asked = call.model or self.runtime.default_model
        if not asked:
            raise InvalidRequest(
                "you must provide a model parameter (no model_route.default is configured)",
                param="model",
                code="missing_model",
            )
        return asked, self.target(call.key, asked)

    def _listed(self, model: str) -> bool:
        """Some domain lists `model` (a pattern alias never hides a served model)."""
        return any(model in (d.models() or ()) for d in self.domains)

    def plan(self, call: ClientRequest) -> tuple[str, list[Domain]]:
        """The model to serve and the domains serving it; fallbacks are planned only when
        this one fails (`fallbacks`)."""
        asked, target = self.resolve(call)
        key = call.key
        domains = self.speakers(call.endpoint)
        if not domains and call.endpoint.responses:
            raise NotFound(
                "no domain serves the Responses API: a [[scale_up]] domain with api_style "
                '"openai" or "both" and responses = true is needed'
            )
        if not domains:
            raise NotFound(
                f"no domain speaks the API of {call.endpoint.path}: set api_style = "
                f'"{"anthropic" if call.endpoint.anthropic else "openai"}" (or "both") on a '
                "[[scale_up]] domain"
            )
        first = serving(domains, target, key.domain)
        if not first:
            raise ModelNotFound(_not_found(asked, key.domain), param="model")
        if call.home is not None:
            first = [d for d in first if d.name == call.home]
            if not first:
                raise InvalidRequest(
                    f"previous_response_id names a response held by domain '{call.home}', "
                    f"which does not serve model '{asked}' for this key",
                    param="previous_response_id",
                )
        return target, first

    def fallback_models(self) -> list[str]:
        """Every model `model_route.fallback` may send a request to (aliases resolved)."""
        return [self.aliases.resolve(name, self._listed) for name in self.runtime.fallbacks]

    def fallbacks(self, call: ClientRequest, target: str) -> Iterator[tuple[str, list[Domain]]]:
        domains = self.speakers(call.endpoint)
        key = call.key
        for name in self.runtime.fallbacks:
            fb = self.aliases.resolve(name, self._listed)
            if fb == target or not self._allowed(key.models, name, fb):
                continue
            candidates = serving(domains, fb, key.domain)
            if call.home is not None:  # the previous response is there, and only there
                candidates = [d for d in candidates if d.name == call.home]
            if candidates:
                yield fb, candidates

    @staticmethod
    def _allowed(models: frozenset[str] | None, asked: str, target: str) -> bool:
        return models is None or asked in models or target in models


def _not_found(model: str, pinned: str | None) -> str:
    where = f" in domain '{pinned}' (this key is pinned to it)" if pinned else ""
    return (
        f"The model '{model}' does not exist or is not served{where}. GET /v1/models lists the "
        "models this gateway serves; check model_route and model_aliases in settings.json and "
        "each domain's `models` in config.toml."
    )
