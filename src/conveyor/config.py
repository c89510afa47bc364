"""Settings: a YAML file, then environment variables, then flags; validated once."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from conveyor.errors import ConfigError
from conveyor.jobs.config import JobsConfig
from conveyor.tenants.config import (
    ModelLimits,
    PricingConfig,
    RateLimitsConfig,
    TenancyConfig,
    TenantConfig,
)

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
DEFAULT_MAX_INPUTS = 2048  # OpenAI's own limit on inputs in one embeddings request


class _Strict(BaseModel):
    """Base for config sections: unknown keys are mistakes, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchingConfig(_Strict):
    """Knobs every one-shot model shares; they sit flat in the model's entry."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    max_batch_size: int = Field(default=32, ge=1, le=65536)
    max_wait_ms: float = Field(default=5.0, ge=0, le=60_000)
    max_batch_tokens: int | None = Field(
        default=None, ge=1, description="Padded tokens per batch (inputs x longest input)."
    )
    max_queue: int = Field(default=2048, ge=1, description="Inputs waiting, per priority class.")
    timeout_ms: float = Field(default=30_000, gt=0)
    max_inputs_per_request: int | None = Field(
        default=None,
        ge=1,
        description="Default min(2048, max_queue); above max_queue a request could never fit.",
    )
    memory_mb: int | None = Field(
        default=None, ge=1, description="Memory the loaded model takes (for the model budget)."
    )
    gpu_hour_usd: float | None = Field(
        default=None, ge=0, description="This model's price (default: pricing.gpu_hour_usd)."
    )
    mixed_batch_slack_ms: float = Field(
        default=5.0,
        ge=0,
        description="While a batch job shares the model with online traffic, batches are "
        "capped so the two an online input may wait for take at most a one-input batch + "
        "a full batch + this slack (see batching/mix.py).",
    )

    @model_validator(mode="after")
    def _request_fits_queue(self) -> BatchingConfig:
        if self.max_inputs_per_request is not None and self.max_inputs_per_request > self.max_queue:
            raise ValueError(
                f"max_inputs_per_request ({self.max_inputs_per_request}) must be <= "
                f"max_queue ({self.max_queue}): a larger request could never be queued"
            )
        return self

    @property
    def input_limit(self) -> int:
        """Inputs one request may carry: ``max_inputs_per_request``, else min(2048, queue)."""
        if self.max_inputs_per_request is not None:
            return self.max_inputs_per_request
        return min(DEFAULT_MAX_INPUTS, self.max_queue)


class SyntheticModelConfig(BatchingConfig):
    """A calibrated stand-in for a GPU model: sleeps for its batch time, so the GIL is free."""

    kind: Literal["synthetic"]
    batch_latency_ms: float = Field(default=20.0, ge=0)
    per_item_ms: float = Field(default=0.0, ge=0)
    dim: int = Field(default=8, ge=1, le=65536)
    max_input_tokens: int = Field(default=512, ge=1)
    fail_marker: str | None = None
    crash_marker: str | None = Field(
        default=None,
        description="Inputs containing it make encoding raise a plain RuntimeError: a "
        "server bug on purpose (500), for testing how crashes are answered.",
    )
    oom_above: int | None = Field(default=None, ge=1)
    slow_marker: str | None = None
    slow_ms: float = Field(default=0.0, ge=0)


class EmbeddingModelConfig(BatchingConfig):
    """A sentence-transformers / Hugging Face encoder; the bundled MiniLM when no path."""

    kind: Literal["embedding"]
    path: Path | None = None
    device: str = "auto"
    max_input_tokens: int | None = Field(default=None, ge=1)
    threads: int | None = Field(default=None, ge=1, description="torch intra-op threads (CPU).")

    @field_validator("path")
    @classmethod
    def _path_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"model directory {value} does not exist")
        return value


class GenerateModelConfig(_Strict):
    """A generative Llama-family checkpoint served with continuous batching.

    The KV cache holds ``kv_cache_tokens`` tokens, or on CUDA takes
    ``kv_cache_memory_fraction`` of the device; with neither, 0.9 of a CUDA device or
    16384 tokens elsewhere. ``max_queue`` bounds requests waiting for admission.
    """

    kind: Literal["generate"]
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    path: Path
    device: str = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    max_num_seqs: int = Field(default=64, ge=1, le=65536)
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    gpu_hour_usd: float | None = Field(
        default=None, ge=0, description="This model's price (default: pricing.gpu_hour_usd)."
    )
    kv_cache_tokens: int | None = Field(default=None, ge=1)
    kv_cache_memory_fraction: float | None = Field(default=None, gt=0, le=1)
    block_size: int = Field(default=16, ge=1, le=1024)
    max_model_len: int | None = Field(
        default=None, ge=2, description="Prompt plus output; default: the model's own limit."
    )
    max_queue: int = Field(default=1024, ge=1)
    timeout_ms: float = Field(default=30_000, gt=0, description="Deadline for the first token.")
    threads: int | None = Field(default=None, ge=1, description="torch intra-op threads (CPU).")

    @field_validator("path")
    @classmethod
    def _path_exists(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"model directory {value} does not exist")
        return value

    @model_validator(mode="after")
    def _consistent_limits(self) -> GenerateModelConfig:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.kv_cache_tokens is not None and self.kv_cache_memory_fraction is not None:
            raise ValueError("set kv_cache_tokens or kv_cache_memory_fraction, not both")
        return self

    @property
    def max_batch_size(self) -> int:
        """Sequences the model runs at once (what capacity sums mean for one-shot models)."""
        return self.max_num_seqs


ModelConfig = Annotated[
    SyntheticModelConfig | EmbeddingModelConfig | GenerateModelConfig,
    Field(discriminator="kind"),
]


class ApiKey(_Strict):
    """An accepted API key and the tenant it belongs to.

    Give the key itself (``key``) or only its SHA-256 in hex (``key_sha256``, e.g.
    ``printf %s "$KEY" | sha256sum``), so that the file holds no usable key.
    """

    key: str | None = Field(default=None, min_length=8)
    key_sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    tenant: str = "default"
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

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_keys: list[ApiKey] = Field(default_factory=list)
    data_dir: Path = Path("data")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    models: list[ModelConfig] = Field(default_factory=list)
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    max_request_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Largest request body (413 above it); file uploads have their own limit. "
        "16 MiB holds a few million tokens of prompt, past any context window served today.",
    )
    max_connections: int = Field(
        default=2048,
        ge=1,
        description="Open connections (and requests in progress) per process; beyond it "
        "a new request gets 503 and its connection is closed.",
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
    metrics_auth: bool = Field(
        default=False, description="/metrics needs an API key like every /v1 route."
    )
    model_memory_budget_mb: int | None = Field(
        default=None,
        ge=1,
        description="Load one-shot models on first use within this budget, evicting the least "
        "recently used idle one; unset: load every model at start-up.",
    )

    tenants: list[TenantConfig] = Field(default_factory=list)
    default_tenant_limits: ModelLimits | None = None
    rate_limits: RateLimitsConfig = Field(default_factory=RateLimitsConfig)
    pricing: PricingConfig = Field(default_factory=PricingConfig)

    @property
    def tenancy(self) -> TenancyConfig:
        """The tenant settings together (validated: unique tenant names)."""
        return TenancyConfig(
            tenants=self.tenants,
            default_tenant_limits=self.default_tenant_limits,
            rate_limits=self.rate_limits,
            pricing=self.pricing,
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
            object.__setattr__(self, "models", [default_model_config()])
        names = [model.name for model in self.models]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"model names must be unique; repeated: {', '.join(duplicates)}")
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
    ) -> SyntheticModelConfig | EmbeddingModelConfig | GenerateModelConfig | None:
        """The model entry of that name, if configured."""
        return next((model for model in self.models if model.name == name), None)


def default_model_config() -> EmbeddingModelConfig:
    """The model served when no configuration names one: the bundled all-MiniLM-L6-v2."""
    return EmbeddingModelConfig(
        name=DEFAULT_MODEL_NAME, kind="embedding", max_batch_size=64, max_wait_ms=5
    )


def _format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        lines.append(f"  {where}: {error['msg']}")
    return "\n".join(lines)


def _env_overrides(env: dict[str, str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if "CONVEYOR_HOST" in env:
        overrides["host"] = env["CONVEYOR_HOST"]
    if "CONVEYOR_PORT" in env:
        overrides["port"] = env["CONVEYOR_PORT"]
    if "CONVEYOR_DATA_DIR" in env:
        overrides["data_dir"] = env["CONVEYOR_DATA_DIR"]
    if "CONVEYOR_API_KEYS" in env:
        overrides["api_keys"] = [key for key in env["CONVEYOR_API_KEYS"].split(",") if key]
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
    raw.update(_env_overrides(dict(os.environ) if env is None else env))
    raw.update({key: value for key, value in (overrides or {}).items() if value is not None})
    try:
        return ServerConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from exc
