"""Declared configuration: one typed model over both seed files.

`config.toml` (cluster side) and `settings.json` (access side) are two views of one
namespace: every section below may appear in either file, settings.json wins over
config.toml, and `TOKENGATE_<SECTION>__<FIELD>` environment variables win over both.
Every model forbids unknown keys so a typo is an error, not a silently ignored knob.
Each `Field(description=...)` is also docs/configuration.md's reference
(`tokengate config-reference` renders it), so a description is written for operators.
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.config.access import (
    AffinityConfig,
    BreakerConfig,
    HealthCheckConfig,
    KeyConfig,
    ModelRouteConfig,
    RateLimitConfig,
    RetryPolicyConfig,
    SessionsConfig,
)
from app.config.alerting import AlertsConfig
from app.config.billing import BillingConfig, BudgetConfig, PriceConfig, TeamConfig
from app.config.cluster import (
    ClusterConfig,
    LoggingConfig,
    ScaleOutConfig,
    ScaleUpConfig,
    TokenSchedulerConfig,
)
from app.config.section import DomainName, Money, PositiveInt, Section
from app.config.serving import (
    MetricsConfig,
    ResponsesConfig,
    ServerConfig,
    TracingConfig,
    UiConfig,
)
from app.config.state import (
    AuditConfig,
    BatchConfig,
    DatabaseConfig,
    LedgerConfig,
    RedisConfig,
)

# The sections live in modules by concern; this is the one place everything imports them
# from, beside the root model.
__all__ = [
    "AffinityConfig",
    "AlertsConfig",
    "AuditConfig",
    "BatchConfig",
    "BillingConfig",
    "BreakerConfig",
    "BudgetConfig",
    "ClusterConfig",
    "DatabaseConfig",
    "DomainName",
    "HealthCheckConfig",
    "KeyConfig",
    "LedgerConfig",
    "LoggingConfig",
    "MetricsConfig",
    "ModelRouteConfig",
    "Money",
    "PositiveInt",
    "PriceConfig",
    "RateLimitConfig",
    "RedisConfig",
    "ResponsesConfig",
    "RetryPolicyConfig",
    "ScaleOutConfig",
    "ScaleUpConfig",
    "Section",
    "ServerConfig",
    "SessionsConfig",
    "Settings",
    "TeamConfig",
    "TokenSchedulerConfig",
    "TracingConfig",
    "UiConfig",
]


class Settings(BaseSettings):
    """The whole configuration. Paths are bound by `app.config.sources.load_settings`."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        env_prefix="TOKENGATE_",
        env_nested_delimiter="__",
        case_sensitive=False,
    )

    # config.toml (seed)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    token_scheduler: TokenSchedulerConfig = Field(default_factory=TokenSchedulerConfig)
    scale_up: ScaleUpConfig | list[ScaleUpConfig] | None = Field(
        None, description="One Scale-up domain (table) or several (`[[scale_up]]` array)."
    )
    scale_out: ScaleOutConfig = Field(default_factory=ScaleOutConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    # settings.json (seed)
    api_endpoint: str | None = Field(
        None, description="Upstream base URL; wins over `token_scheduler.api_base`."
    )
    api_key: SecretStr | None = Field(
        None,
        description="Default upstream key, normally `${TAOTOKEN_API_KEY}` expanded from the "
        "environment. Not settable as TOKENGATE_API_KEY (that name is the client key of "
        "`tokengate check`).",
    )
    model_route: ModelRouteConfig = Field(default_factory=ModelRouteConfig)
    rate_limit: RateLimitConfig = Field(default_factory=RateLimitConfig)
    retry_policy: RetryPolicyConfig = Field(default_factory=RetryPolicyConfig)
    health_check: HealthCheckConfig = Field(default_factory=HealthCheckConfig)

    # added by tokengate
    keys: list[KeyConfig] = Field(default_factory=list, description="Gateway client keys.")
    admin_key: SecretStr | None = Field(
        None, description="Key guarding `/admin/*` (`TOKENGATE_ADMIN_KEY`); unset disables them."
    )
    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="Client-facing model names mapped to upstream ids, applied before routing.",
    )
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    affinity: AffinityConfig = Field(default_factory=AffinityConfig)
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    ui: UiConfig = Field(default_factory=UiConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    responses: ResponsesConfig = Field(default_factory=ResponsesConfig)
    billing: BillingConfig = Field(default_factory=BillingConfig)
    teams: list[TeamConfig] = Field(
        default_factory=list, description="Teams: a name and its budgets; keys join with `team`."
    )
    tracing: TracingConfig = Field(default_factory=TracingConfig)
